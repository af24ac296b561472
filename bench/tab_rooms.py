"""Rooms of tabs, measured (issue 33, item 4): 1, 2 and 3 Chromium tabs, and 2 tabs plus one
``daisy-peer``, train the default CNN (image task) at batch 64 and 256, every device its own
process in its own network namespace, 1 ms each way between any two of them.

    sudo .venv/bin/python -m bench.tab_rooms [--batches 64,256] [--steps 16] [--rounds 1]

This kernel's ``tc`` has no netem, and a tab's SCTP is Chromium's own (the user-space delay
of bench/scaling.py's daisy-peers cannot reach it), so the delay is a delay line
(bench/delay_line.py): each namespace reaches the others only through a tun device whose
packets one process holds 1 ms and writes into the destination's tun. The server (signaling,
the page, the data) sits in the bench's own namespace behind its own tun, 1 ms away too. A
timed UDP echo between two tab namespaces, through the same line, checks the delay.

Each tab: its own headless Chromium (``nsenter`` into its namespace, the CPU path: no WebGPU
flag), its own context, the page's defaults (its pool of compute workers, its capacity
probe). Tab 0 hosts a private room, approves the others and starts the run through
``mesh.start({task: "image", steps, batch})``, the same run as ``daisychain train --task
image --steps S --batch B``: every tab (and the daisy-peer) must end on train's hash.
Steps/s = the host tab's ``run:step`` events after the first ``--skip`` steps; the ratio is
against the 1-tab room of the same batch and round.

``--pin``: every device gets a core of its own (``taskset``: tab i on core i, the daisy-peer
on the core after the tabs'), as devices have, and only the rooms with a core for each device
run; the report goes to its own section ("tab_rooms_pinned"). The server and the delay line
are not pinned.

Needs root (namespaces, tun). It re-executes itself in a private network namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._chromium import BASE_ARGS, CHROMIUM, disable_features

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent
SERVER_IP, PORT = "10.79.0.1", 8790
URL = f"http://{SERVER_IP}:{PORT}"
ARGS = [*BASE_ARGS, f"--unsafely-treat-insecure-origin-as-secure={URL}"]  # the page needs a secure context
ROOMS = {"1 tab": (1, 0), "2 tabs": (2, 0), "3 tabs": (3, 0), "2 tabs + 1 daisy-peer": (2, 1)}
ROOM_OF = "window.__daisy.room"
WRAPPER = ('#!/bin/sh\nif [ -n "$DAISY_CPU" ]; then set -- taskset -c "$DAISY_CPU" %s "$@"; '
           'else set -- %s "$@"; fi\nexec nsenter --net=/proc/"$DAISY_NS_PID"/ns/net -- "$@"\n' % (CHROMIUM, CHROMIUM))
#: --profile: every page's compute-worker calls, timed from the page (op, start, end)
WRAP = """async () => { window.__ops = [];
  const { computePool } = await import('/webui/shell/worker/trainer_proxy.js');
  for (const w of computePool().workers) { const post = w.post.bind(w);
    w.post = async (op, body, tr) => { const t0 = performance.now(); const r = await post(op, body, tr);
      window.__ops.push([op, t0, performance.now()]); return r; }; } }"""
#: --trace: every page logs [time ms (its clock: timeOrigin + now, one machine so one clock),
#: what, detail]: frames arriving (bytes), outputs of the run protocol (out), frames put on a
#: channel (send0/send1), compute-worker calls (op0/op1), the protocol's handling of each
#: message (rcv0/rcv1), the step events (step), and the pieces of a step's handling (x0/x1 and
#: the name: the replica's Adam `apply`, its `rehash`, the rollback window's `record` and
#: `encode`, the coordinator's `_commit` and its split of the next step, `begin`)
TRACE = """async () => { const m = window.__daisy.mesh; const T = () => performance.timeOrigin + performance.now();
  const tr = window.__tr = [];
  const ob = m._onBytes.bind(m); m._onBytes = (id, data) => { tr.push([T(), 'bytes', data.byteLength]); return ob(id, data); };
  const pf = m._perform.bind(m); m._perform = async (outs) => {
    for (const o of outs) tr.push([T(), 'out', o.kind + (o.message ? ':' + o.message.T : '')]); return pf(outs); };
  const sd = m.net.send.bind(m.net); m.net.send = async (to, f) => {
    tr.push([T(), 'send0', f.byteLength]); const r = await sd(to, f); tr.push([T(), 'send1', f.byteLength]); return r; };
  const { computePool } = await import('/webui/shell/worker/trainer_proxy.js');
  for (const w of computePool().workers) { const post = w.post.bind(w);
    w.post = async (op, body, t) => { tr.push([T(), 'op0', op]); const r = await post(op, body, t); tr.push([T(), 'op1', op]); return r; }; }
  const span = (o, name) => { if (!o || o['__' + name]) return; o['__' + name] = 1; const f = o[name].bind(o);
    o[name] = (...a) => { tr.push([T(), 'x0', name]); const r = f(...a); const end = (x) => { tr.push([T(), 'x1', name]); return x; };
      return r && r.then ? r.then(end) : end(r); }; };
  let wrapped = null;
  setInterval(() => { const p = m.peer; if (p && p !== wrapped) { wrapped = p; const rc = p.receive.bind(p);
    p.receive = async (id, msg, run) => { tr.push([T(), 'rcv0', msg.T]); const r = await rc(id, msg, run); tr.push([T(), 'rcv1', msg.T]); return r; }; }
    if (!p) return;
    span(p.member, 'rehash'); span(p.member.trainer, 'apply'); span(p.member.window, 'record'); span(p.member.window, 'encode');
    const c = p.coordinator; if (c) { span(c, '_commit'); span(c.aggregation, 'begin'); } }, 5);
  m.bus.on("run:step", (d) => { tr.push([T(), 'step', d.step]); const c = m.peer && m.peer.coordinator;
    if (c) tr.push([T(), 'est', JSON.stringify({ self: c.selfSpm, cap: c.capacity, crew: [...c.crew.values()].map((x) =>
      [x.id, x.linkS, x.capacity, x.secPerMicro]) })]); }); }"""


def room_phases(traces: list, skip: int) -> dict | None:
    """Where a room's step goes, from the --trace logs (pages[0] the host): medians over the
    timed steps, in ms. Each message is matched to its arrival by its byte count (the first
    frame of that size the other side receives after it went on the channel)."""
    import statistics

    if len(traces) < 2:
        return None
    host, guests = traces[0], traces[1:]
    steps = [t for t, k, v in host if k == "step" and v > skip]
    if len(steps) < 3:
        return None
    lo, hi = steps[0], steps[-1]

    def med(xs):
        return round(statistics.median(xs), 1) if xs else None

    def arrivals(sender, receiver):  # [(sent, arrived, bytes)] of sender's frames
        got = [(t, v) for t, k, v in receiver if k == "bytes"]
        out = []
        for t, k, v in sender:
            if k == "send0" and lo <= t <= hi:
                a = next((t2 for t2, v2 in got if v2 == v and t2 >= t), None)
                if a is not None:
                    out.append((t, a, v))
        return out

    def spans(log, a, b):  # op0 -> op1 and the like, each pair once
        out, start = [], None
        for t, k, v in log:
            if k == a[0] and (a[1] is None or v == a[1]):
                start = t
            elif k == b[0] and (b[1] is None or v == b[1]) and start is not None:
                if lo <= start <= hi:
                    out.append(t - start)
                start = None
        return out

    def after(log, t0, kind, detail=None):
        return next((t for t, k, v in log if t >= t0 and k == kind and (detail is None or v == detail)), None)

    down, up = arrivals(host, guests[0]), arrivals(guests[0], host)
    # host: the last contribution in -> the total on the channel; waiting: its compute done -> that contribution in
    handle_h, wait_h = [], []
    for t, k, v in host:
        if k == "out" and v == "send:total" and lo <= t <= hi:
            sent = after(host, t, "send0")
            last_in = max((a for _, a, _ in up if a <= t), default=None)
            if sent is not None and last_in is not None:
                handle_h.append(sent - last_in)
                done = max((t2 for t2, k2, v2 in host if k2 == "op1" and v2 == "contribute" and t2 <= t), default=None)
                if done is not None:
                    wait_h.append(max(0.0, last_in - done))
    # guest: the total in -> its compute starts; its compute done -> the contribution on the channel
    g = guests[0]
    in_g, out_g = [], []
    for _, a, _ in down:
        start = after(g, a, "op0", "contribute")
        if start is not None:
            in_g.append(start - a)
    for t, k, v in g:
        if k == "op1" and v == "contribute" and lo <= t <= hi:
            sent = after(g, t, "send0")
            if sent is not None:
                out_g.append(sent - t)
    def pieces(log):  # x0 name -> x1 name, each call's ms
        out, start = {}, {}
        for t, k, v in log:
            if k == "x0":
                start[v] = t
            elif k == "x1" and v in start and lo <= start[v] <= hi:
                out.setdefault(v, []).append(t - start.pop(v))
        return {k: med(v) for k, v in out.items()}

    def gaps(log, a, b):  # each a -> the next b
        out = []
        for i, (t, k, v) in enumerate(log):
            if (k, v) == a and lo <= t <= hi:
                nb = next((t2 for t2, k2, v2 in log[i:] if (k2, v2) == b or (b[1] is None and k2 == b[0])), None)
                if nb is not None:
                    out.append(nb - t)
        return med(out)

    # the host's commit: from its start to its Adam is the sum of the contributions (Star.total)
    ph, pg = pieces(host), pieces(g)
    handling = {"host_sum": gaps(host, ("x0", "_commit"), ("x0", "apply")), "host_adam": ph.get("apply"),
                "host_encode": ph.get("encode"), "host_record": ph.get("record"), "host_hash": ph.get("rehash"),
                "host_split": ph.get("begin"), "host_commit": ph.get("_commit"),
                "host_page": gaps(host, ("out", "committed"), ("step", None)),
                "guest_decode": med([(after(g, a, "rcv0") or a) - a for _, a, _ in down]),
                "guest_adam": pg.get("apply"), "guest_record": pg.get("record"), "guest_hash": pg.get("rehash"),
                "guest_page": gaps(g, ("out", "committed"), ("step", None))}
    return {**handling, "step": med([b - a for a, b in zip(steps, steps[1:])]),
            "host_compute": med(spans(host, ("op0", "contribute"), ("op1", "contribute"))),
            "guest_compute": med(spans(g, ("op0", "contribute"), ("op1", "contribute"))),
            "down": med([a - t for t, a, _ in down]), "down_bytes": med([v for _, _, v in down]),
            "up": med([a - t for t, a, _ in up]), "up_bytes": med([v for _, _, v in up]),
            "guest_in": med(in_g), "guest_out": med(out_g), "host_handle": med(handle_h), "host_wait": med(wait_h)}


RECORD = """() => { window.__steps = [];
  window.__daisy.mesh.bus.on("run:step", (d) => window.__steps.push([performance.now(), d.step])); }"""


def ip_of(i: int) -> str:
    return f"10.79.0.{11 + i}"


def udp_drops(pid: int) -> int:
    """UDP datagrams the namespace of ``pid`` dropped for a full receive buffer (a browser
    whose network thread did not read its socket in time: SCTP then waits a retransmission
    timeout), from its /proc/net/snmp."""
    return rcvbuf_errors(Path(f"/proc/{pid}/net/snmp").read_text())


def rcvbuf_errors(snmp: str) -> int:
    """The Udp RcvbufErrors counter of a /proc/net/snmp text (its header line, then values)."""
    lines = [ln.split() for ln in snmp.splitlines() if ln.startswith("Udp:")]
    return int(dict(zip(lines[0][1:], lines[1][1:])).get("RcvbufErrors", 0))


def load() -> float:
    return os.getloadavg()[0]


def reference(steps: int, batch: int, local: tuple[int, int] = (1, 1)) -> dict:
    extra = ["--replicas", str(local[0]), "--sync-every", str(local[1])] if local != (1, 1) else []
    out = subprocess.run([str(BIN / "daisychain"), "train", "--task", "image", "--steps", str(steps),
                          "--batch", str(batch), *extra, "--json", "--quiet"],
                         capture_output=True, text=True, timeout=1800, check=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def _top(profile: dict, k: int = 12) -> list:
    """The k functions with the most self time in a CDP CPU profile: [name, ms, share]."""
    nodes = {n["id"]: n["callFrame"] for n in profile["nodes"]}
    self_us: dict[str, float] = {}
    for sid, d in zip(profile["samples"], profile["timeDeltas"]):
        cf = nodes[sid]
        name = f'{cf["functionName"] or "(anonymous)"} {cf["url"].rsplit("/", 1)[-1]}:{cf["lineNumber"] + 1}'.strip()
        self_us[name] = self_us.get(name, 0.0) + d
    total = sum(self_us.values()) or 1.0
    return [[n, us / 1e3, us / total] for n, us in sorted(self_us.items(), key=lambda x: -x[1])[:k]]


def run_room(browsers, peer_ns: int, n_tabs: int, n_peers: int, batch: int, steps: int, skip: int,
             tmp: Path, tag: str, room_s: float, peer_cpu: int | None = None, profile: bool = False,
             trace: bool = False, no_draw: bool = False, local: tuple[int, int] = (1, 1)) -> dict:
    """One room: tab 0 hosts, the other tabs and the daisy-peer join; the run to its end (a
    row with "error" when it is not done in ``room_s`` seconds). ``profile``: each page's main
    thread is CPU-profiled over the timed steps and its compute-worker calls timed. ``trace``:
    every page logs when each message arrives, is handled and is put on its channel, and each
    compute call (``room_phases``). ``no_draw``: every page's body is hidden once the room is
    up (no layout or paint), to see what drawing the page costs a step."""
    ctxs, peer = [], None
    try:
        pages = []
        for i in range(n_tabs):
            ctx = browsers[i].new_context()
            ctxs.append(ctx)
            pages.append(ctx.new_page())
        host = pages[0]
        host.goto(f"{URL}/?name=t0&create=1")
        host.wait_for_function(f"window.__daisy && window.__daisy.device !== null && {ROOM_OF} "
                               f"&& {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost", timeout=300_000)
        code = host.evaluate(f"() => {ROOM_OF}.code")
        names = [f"t{i}" for i in range(1, n_tabs)]
        for i, pg in enumerate(pages[1:], 1):
            pg.goto(f"{URL}/?name=t{i}&room={code}")
        if n_peers:
            names.append("py")
            err = open(tmp / f"{tag}-peer.err", "w")
            pin = [] if peer_cpu is None else ["taskset", "-c", str(peer_cpu)]
            peer = subprocess.Popen([*pin, "nsenter", f"--net=/proc/{peer_ns}/ns/net", "--", str(BIN / "daisy-peer"),
                                     "--server", URL, "--room", code, "--name", "py", "--json", "--quiet"],
                                    stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        for name in names:
            sel = f"#approvals li[data-peer]:has-text('{name}') button.approve"
            host.wait_for_selector(sel, timeout=300_000)
            host.click(sel)
        for pg in pages:
            pg.wait_for_function("window.__daisy && window.__daisy.device !== null", timeout=300_000)
        host.wait_for_function(f"Object.values(window.__daisy.links).filter((s) => s === 'open').length "
                               f"=== {len(names)}", timeout=120_000)
        devices = [pg.evaluate("() => { const d = window.__daisy.device; return { kind: d.kind, "
                               "cpuPath: d.cpuPath, workers: d.workers.size, capacity: d.capacity }; }")
                   for pg in pages]
        host.evaluate(RECORD)
        for pg in pages:
            if trace:
                pg.evaluate(TRACE)
            if no_draw:
                pg.evaluate("() => { document.body.style.display = 'none'; }")
        cdps = []
        if profile:
            for pg in pages:
                pg.evaluate(WRAP)
                c = pg.context.new_cdp_session(pg)
                c.send("Profiler.enable")
                c.send("Profiler.setSamplingInterval", {"interval": 250})
                cdps.append(c)
        load0 = load()
        host.evaluate(f"() => {{ window.__daisy.mesh.start({{ task: 'image', steps: {steps}, batch: {batch}, "
                      f"replicas: {local[0]}, sync_every: {local[1]} }}); }}")
        profiles = []
        try:
            if cdps:
                host.wait_for_function(f"window.__steps.length >= {skip + 1}", timeout=room_s * 1000, polling=20)
                for c in cdps:
                    c.send("Profiler.start")
                host.wait_for_function(f"window.__steps.length >= {steps}", timeout=room_s * 1000, polling=20)
                profiles = [c.send("Profiler.stop")["profile"] for c in cdps]
            for pg in pages:
                pg.wait_for_function("window.__daisy.run.state === 'done'", timeout=room_s * 1000, polling=500)
        except Exception as err:  # noqa: BLE001 - a room that stalls is a row that says so
            log = (tmp / f"{tag}-peer.err").read_text()[-600:] if peer else ""
            return {"tabs": n_tabs, "peers": n_peers, "batch": batch, "steps": steps, "error":
                    f"not done in {room_s:.0f} s at step {host.evaluate('() => window.__daisy.run.step')} "
                    f"({type(err).__name__}); daisy-peer's log ends: {log.strip()[-300:]}" if peer else
                    f"not done in {room_s:.0f} s ({type(err).__name__})", "devices": devices, "load": [load0, load()]}
        marks = host.evaluate("() => window.__steps")
        phases = None
        if trace:
            traces = [pg.evaluate("() => window.__tr") for pg in pages]
            (tmp / f"{tag}-trace.json").write_text(json.dumps(traces))
            phases = room_phases(traces, skip)
        runs = [pg.evaluate("() => JSON.parse(JSON.stringify(window.__daisy.run))") for pg in pages]
        py = None
        if peer:
            out, _ = peer.communicate(timeout=300)
            if peer.returncode != 0:
                raise RuntimeError(f"daisy-peer exited {peer.returncode}: {(tmp / f'{tag}-peer.err').read_text()[-800:]}")
            py = json.loads(out.strip().splitlines()[-1])
        times = [t for t, s in marks if s > skip]
        sps = (len(times) - 1) / ((times[-1] - times[0]) / 1e3) if len(times) > 1 else float("nan")
        prof = None
        if profiles and len(times) > 1:
            t0, t1, n = times[0], times[-1], len(times) - 1
            prof = []
            for pg, pr in zip(pages, profiles):
                calls: dict[str, list] = {}
                for op, a0, a1 in pg.evaluate("() => window.__ops"):
                    if t0 <= a0 <= t1:
                        c = calls.setdefault(op, [0, 0.0])
                        c[0] += 1
                        c[1] += a1 - a0
                prof.append({"top": _top(pr), "calls": {op: [c, ms / n] for op, (c, ms) in calls.items()}})
        return {"profile": prof, "phases": phases, "tabs": n_tabs, "peers": n_peers, "batch": batch, "steps": steps, "steps_s": sps,
                "timed_steps": len(times) - 1, "shas": [r["sha"] for r in runs] + ([py["params_sha256"]] if py else []),
                "agreed": all(r.get("agreed") for r in runs) and (py is None or py.get("agreed")),
                "done": runs[0].get("done"), "devices": devices, "load": [load0, load()]}
    finally:
        for ctx in ctxs:
            ctx.close()
        if peer and peer.poll() is None:
            peer.kill()
            peer.wait(10)


def measure(a) -> dict:
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="dc-tabrooms-"))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    sleepers = [subprocess.Popen(["unshare", "-n", "--", "sleep", "infinity"]) for _ in range(4)]
    procs = list(sleepers)
    try:
        mine = os.readlink("/proc/self/ns/net")
        for s in sleepers:  # unshare has run once the namespace differs
            while os.readlink(f"/proc/{s.pid}/ns/net") == mine:
                time.sleep(0.01)
        ends = [f"self:{SERVER_IP}"] + [f"{s.pid}:{ip_of(i)}" for i, s in enumerate(sleepers)]
        line = subprocess.Popen([PY, "-m", "bench.delay_line", "--delay-ms", str(a.delay_ms), *ends],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        procs.append(line)
        ready = line.stdout.readline().strip()
        if not ready.startswith("READY"):
            raise RuntimeError(f"the delay line did not start: {ready}")
        print(ready, file=sys.stderr)
        if a.rate_mbit:  # each namespace's tun sends at most this fast: a burst is paced as on a real link
            for s in sleepers:
                subprocess.run(["nsenter", f"--net=/proc/{s.pid}/ns/net", "--", "tc", "qdisc", "add", "dev", "dt0",
                                "root", "tbf", "rate", f"{a.rate_mbit}mbit", "burst", "32kb", "latency", "200ms"],
                               check=True)
            ready += f", {a.rate_mbit:g} Mbit/s each way"
        echo = {k: json.loads(subprocess.run([PY, "-m", "bench.delay_line", "--echo", x, y, ip], cwd=ROOT,
                                             capture_output=True, text=True, check=True).stdout)
                for k, x, y, ip in (("tab-tab", str(sleepers[0].pid), str(sleepers[1].pid), ip_of(1)),
                                    ("tab-server", str(sleepers[0].pid), "self", SERVER_IP))}
        print(f"UDP echo through the line: {echo}", file=sys.stderr)
        server = subprocess.Popen([str(BIN / "daisychain"), "serve", "--host", SERVER_IP, "--port", str(PORT)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(server)
        if "DaisyChain serving on" not in server.stdout.readline():
            raise RuntimeError("the server did not start")
        wrapper = tmp / "chromium-in-netns"
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
        refs = {b: reference(a.steps_for(b), b, a.local)["params_sha256"] for b in a.batches}
        rows = []
        with sync_playwright() as p:
            feats = disable_features(p, ARGS)
            cores = os.cpu_count() or 1
            n_browsers = min(3, max(ROOMS[r][0] for r in a.rooms))
            browsers = [p.chromium.launch(executable_path=str(wrapper), args=ARGS + [feats],
                                          env={**os.environ, "DAISY_NS_PID": str(s.pid),
                                               **({"DAISY_CPU": str(i % cores)} if a.pin else {})})
                        for i, s in enumerate(sleepers[:n_browsers])]
            for rnd in range(1, a.rounds + 1):
                for b in a.batches:
                    for room in a.rooms:
                        n_tabs, n_peers = ROOMS[room]
                        drops0 = [udp_drops(s.pid) for s in sleepers[:n_browsers]]
                        r = run_room(browsers, sleepers[3].pid, n_tabs, n_peers, b, a.steps_for(b), a.skip,
                                     tmp, f"{rnd}-{b}-{n_tabs}-{n_peers}", a.room_s,
                                     peer_cpu=n_tabs % cores if a.pin else None, profile=a.profile,
                                     trace=a.trace, no_draw=a.no_draw, local=a.local)
                        r.update(room=room, round=rnd, reference=refs[b],
                                 udp_drops=[udp_drops(s.pid) - d for s, d in zip(sleepers[:n_tabs], drops0)])
                        print(json.dumps(r), file=sys.stderr)
                        rows.append(r)
            for br in browsers:
                br.close()
        return {"rows": rows, "echo": echo, "delay_ms": a.delay_ms, "line": ready, "cpus": os.cpu_count(),
                "pinned": bool(a.pin), "local": list(a.local), "skip": a.skip}
    finally:
        for pr in reversed(procs):
            pr.kill()
            pr.wait(10)


def report(res: dict) -> str:
    one = {(r["round"], r["batch"]): r for r in res["rows"] if r["room"] == "1 tab"}
    lines = ["| round | batch | room | steps/s | vs 1 tab (same round) | micro-batches per device (the host tab's count: the split) "
             "| each tab: path, workers | load (1 min) start / end | every device on train's hash "
             "| UDP datagrams dropped, full receive buffer (each tab's namespace) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['round']} | {r['batch']} | {r['room']} | - | - | - | - | "
                         f"{r['load'][0]:.1f} / {r['load'][1]:.1f} | {r['error']} | - |")
            continue
        base = one.get((r["round"], r["batch"]))
        base = base if base and "error" not in base else None
        ratio = f"{r['steps_s'] / base['steps_s']:.2f}x" if base else "n/a"
        done = ", ".join(str(v) for v in (r["done"] or {}).values())
        devs = ", ".join(f"{d['cpuPath'] if d['kind'] == 'cpu' else d['kind']} {d['workers']}" for d in r["devices"])
        same = all(s == r["reference"] for s in r["shas"]) and r["agreed"]
        lines.append(f"| {r['round']} | {r['batch']} | {r['room']} | {r['steps_s']:.2f} | {ratio} | {done} | "
                     f"{devs} | {r['load'][0]:.1f} / {r['load'][1]:.1f} | {'yes' if same else 'NO'} | "
                     f"{', '.join(map(str, r['udp_drops'])) if 'udp_drops' in r else '-'} |")
    prof_lines = []
    for r in res["rows"]:
        for i, pp in enumerate(r.get("profile") or []):
            if not prof_lines:
                prof_lines = ["", "Where a step goes (`--profile`): each page's main thread, CPU-profiled over the timed "
                              "steps (Chromium's sampling profiler, self time per step: `(idle)` is the thread "
                              "waiting, `(program)` native work outside JS: style, layout, paint, messaging), and "
                              "its compute-worker calls timed from the page (a call's time includes its wait in the "
                              "worker's queue).", "",
                              "| round | batch | room | tab | main thread, ms per step: the most self time | "
                              "worker calls per step: count, ms |", "|---|---|---|---|---|---|"]
            n = max(1, r.get("timed_steps") or 1)
            top = "; ".join(f"{name} {ms / n:.1f}" for name, ms, _ in pp["top"][:8])
            calls = "; ".join(f"{op} {c / n:.2f}, {ms:.1f}" for op, (c, ms) in pp["calls"].items())
            prof_lines.append(f"| {r['round']} | {r['batch']} | {r['room']} | {'host' if i == 0 else f'guest {i}'} | "
                              f"{top} | {calls} |")
    lines += prof_lines
    phase_lines = []
    for r in res["rows"]:
        ph = r.get("phases")
        if not ph:
            continue
        if not phase_lines:
            phase_lines = ["", "Where a room's step goes (`--trace`; medians over the timed steps, ms, the host tab "
                           "and its first guest; one clock, the machine's): each tab's compute-worker calls, each "
                           "message from the moment its frame goes on the channel until the other tab's page "
                           "receives it (SCTP, the delay line, both browsers' network threads), and each side's "
                           "handling: the guest from the total's arrival to its compute (decode, Adam, the "
                           "parameters' hash), from its compute to the contribution on the channel (encode); the "
                           "host from the last contribution's arrival to the total on the channel (decode, sum, "
                           "Adam, the rollback record, the hash, encode), and how long its own compute had been "
                           "done by then (idle on the critical path).", "",
                           "| round | batch | room | step | host compute | guest compute | total down (bytes) | "
                           "contribution up (bytes) | guest: total in -> compute | guest: compute -> channel | "
                           "host: contribution in -> total on the channel | host idle, waiting |",
                           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        f = lambda k: "-" if ph.get(k) is None else f"{ph[k]:.1f}"  # noqa: E731
        phase_lines.append(f"| {r['round']} | {r['batch']} | {r['room']} | {f('step')} | {f('host_compute')} | "
                           f"{f('guest_compute')} | {f('down')} ({ph['down_bytes'] or 0:,.0f}) | {f('up')} "
                           f"({ph['up_bytes'] or 0:,.0f}) | {f('guest_in')} | {f('guest_out')} | {f('host_handle')} | "
                           f"{f('host_wait')} |")
    lines += phase_lines
    piece_lines = []
    for r in res["rows"]:
        ph = r.get("phases")
        if not ph or ph.get("host_commit") is None:
            continue
        if not piece_lines:
            piece_lines = ["", "The handling, piece by piece (`--trace`; medians, ms): the host's commit (the sum of "
                           "the contributions, Adam, the total's encoding, the rollback record, the parameters' "
                           "hash, the next step's split; all of it) and its page's listeners of the step event; the "
                           "guest from the total's arrival to the protocol taking it (the frame's decoding), its "
                           "Adam, record, hash and page listeners.", "",
                           "| round | batch | room | host: sum | Adam | encode | record | hash | split | commit | "
                           "page | guest: decode | Adam | record | hash | page |",
                           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        f = lambda k: "-" if ph.get(k) is None else f"{ph[k]:.1f}"  # noqa: E731
        keys = ("host_sum", "host_adam", "host_encode", "host_record", "host_hash", "host_split", "host_commit",
                "host_page", "guest_decode", "guest_adam", "guest_record", "guest_hash", "guest_page")
        piece_lines.append(f"| {r['round']} | {r['batch']} | {r['room']} | " + " | ".join(f(k) for k in keys) + " |")
    lines += piece_lines
    e = res["echo"]
    return "\n".join([
        f"Every device: its own process (a headless Chromium, or `daisy-peer`) in its own network "
        f"namespace; between any two namespaces (the server's too) {res['delay_ms']:g} ms each way, "
        f"added by a user-space delay line through tun devices (bench/delay_line.py: this kernel "
        f"has no netem, and Chromium's SCTP is its own). The line, checked by a timed UDP echo "
        f"(32 B, 200 round trips, median [p10, p90]): tab to tab {e['tab-tab']['median_ms']:.2f} ms "
        f"[{e['tab-tab']['p10_ms']:.2f}, {e['tab-tab']['p90_ms']:.2f}], tab to server "
        f"{e['tab-server']['median_ms']:.2f} ms [{e['tab-server']['p10_ms']:.2f}, "
        f"{e['tab-server']['p90_ms']:.2f}] ({res['line'].removeprefix('READY ')}).",
        "",
        (f"This machine has {res['cpus']} cores. Pinned (`--pin`): every device on a core of its "
         "own (`taskset`; tab i on core i, the daisy-peer on the next), as devices of their own "
         "have; the server and the delay line share them. The load column says what else ran."
         if res.get("pinned") else
         f"This machine has {res['cpus']} cores, shared with other work while "
         "this ran (the load column): each tab computes on its own worker pool, so 2 and 3 tabs "
         "share the cores with each other and with that work. The ratios say what a room gains here, "
         "not what it gains on devices of their own (`--pin` gives each device a core)."),
        "",
        "Run: the default CNN (image task, the recipe's defaults), `mesh.start({task: 'image', steps, "
        "batch" + (", replicas, sync_every" if tuple(res.get("local", (1, 1))) != (1, 1) else "") +
        "})` in the host tab, the run `daisychain train --task image --steps S --batch B" +
        (" --replicas {} --sync-every {}".format(*res["local"]) if tuple(res.get("local", (1, 1))) != (1, 1) else "") +
        "` makes (" + ", ".join(f"{s} steps at batch {b}" for b, s in sorted({(r['batch'], r['steps'])
                                                                            for r in res['rows']})) +
        "); steps/s from the host tab's step events after the first " + str(res.get("skip", 3)) +
        " steps (start-up: ICE, the data, the first compiles" + (", and the page's first 4 points of "
        "each live view, taken at steps 5-20 whatever they cost; a run's later views are held to "
        "their budget, eval_budget.js" if res.get("skip", 3) > 20 else "") + ").",
        "", *lines])


def section_of(res: dict) -> tuple[str, str]:
    """(BENCHMARKS section, its title) of a result: pinned or not, and a local-steps run
    (``--replicas``/``--sync-every``) in a section of its own, so it never replaces the
    synchronous run's figures."""
    local = tuple(res.get("local", (1, 1)))
    if local != (1, 1):
        return ("tab_rooms_local", "## Rooms of tabs with local steps, a core each: 1 and 2 Chromium tabs, "
                f"1 ms each way (bench/tab_rooms.py --pin --replicas {local[0]} --sync-every {local[1]})")
    if res.get("pinned"):
        return ("tab_rooms_pinned", "## Rooms of tabs, a core each: 1 and 2 Chromium tabs, 1 ms each way "
                "(bench/tab_rooms.py --pin)")
    return "tab_rooms", "## Rooms of tabs: 1, 2 and 3 Chromium tabs, 1 ms each way (bench/tab_rooms.py)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--steps", type=int, default=16, help="timed steps at batch 64 (a quarter at 256, at "
                    "least 8), after the --skip steps")
    ap.add_argument("--skip", type=int, default=21, help="steps left out of the rate: start-up, and "
                    "the page's first 4 points of each live view (steps 5-20), which a run takes "
                    "whatever they cost (later ones keep to the views' budget: eval_budget.js)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rooms", default=",".join(ROOMS), help="comma-separated, of: " + ", ".join(ROOMS))
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--rate-mbit", type=float, default=0, help="cap each device's sending rate (tc tbf on its "
                    "tun; 0: none, the line forwards a burst at once)")
    ap.add_argument("--room-s", type=float, default=600, help="a room not done in this many seconds is a failed row")
    ap.add_argument("--out", default=None, help="also write the raw results (JSON) here")
    ap.add_argument("--report", default=None, help="only rewrite the report from an --out file")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--profile", action="store_true", help="CPU-profile every page's main thread over the timed "
                    "steps and time its compute-worker calls (the report says where a step goes)")
    ap.add_argument("--trace", action="store_true", help="log every page's messages and compute calls and "
                    "say where a room's step goes: compute, the link each way, each side's handling")
    ap.add_argument("--no-draw", action="store_true", help="hide every page's body once the room is up (no "
                    "layout or paint): what the page's drawing costs a step")
    ap.add_argument("--replicas", type=int, default=1, help="local steps: replicas (with --sync-every; "
                    "every room trains that run: `daisychain train --replicas R --sync-every H`)")
    ap.add_argument("--sync-every", type=int, default=1, help="local steps: inner steps between outer steps")
    ap.add_argument("--pin", action="store_true", help="every device on a core of its own (only the rooms "
                    "with a core for each device)")
    a = ap.parse_args()
    a.batches = [int(b) for b in a.batches.split(",")]
    a.local = (a.replicas, a.sync_every)
    a.rooms = [r.strip() for r in a.rooms.split(",")]
    bad = [r for r in a.rooms if r not in ROOMS]
    if bad:
        ap.error(f"no room {bad[0]!r}; rooms: {', '.join(ROOMS)}")
    if a.pin:
        cores = os.cpu_count() or 1
        a.rooms = [r for r in a.rooms if sum(ROOMS[r]) <= cores]
        if not a.rooms:
            ap.error(f"--pin: no room has a core for each device on {cores} cores")
    a.steps_for = lambda b: a.skip + max(8, a.steps * 64 // b)
    if a.report:
        res = json.loads(Path(a.report).read_text())
    else:
        if os.environ.get("DAISY_TABROOMS_NS") != "1":
            os.execvp("unshare", ["unshare", "-n", "--", "env", "DAISY_TABROOMS_NS=1", PY, "-m",
                                  "bench.tab_rooms", *sys.argv[1:]])
        res = measure(a)
        res["command"] = "sudo .venv/bin/python -m bench.tab_rooms " + " ".join(sys.argv[1:])
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))
    text = report(res)
    print(text)
    if not a.no_write:
        from bench._report import write_section
        name, title = section_of(res)
        write_section(name, title + "\n\n" + text,
                      res.get("command") or "sudo .venv/bin/python -m bench.tab_rooms " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
