"""Scaling benchmark that looks like real devices: every peer is its own ``daisy-peer``
process (bench/scaling_peer.py: the real one plus timing hooks) in its own network
namespace, joined by a veth pair to a bridge in the server's namespace, pinned to its own
core (``taskset``). Rows: 1 and 2 peers, on the default digits run and on a compute-bound
one (``--layers 256,256``, a large batch), over three networks: the plain veth, a 100 Mbit/s
cap (``tc ... tbf`` on both ends of every veth), and 1 ms of delay each way added in user
space (every outgoing data datagram held 1 ms by the peer process: netem is not in this
kernel). In the same run and network: the raw data channel's round trip and rate between two
namespaces, and a Gloo all-reduce of the same number of values.

    sudo .venv/bin/python -m bench.scaling [--quick]
    sudo .venv/bin/python -m bench.scaling --task image [--layers conv16,pool,...] [--rounds 2]

``--task image`` measures the CNN instead (bench/scaling_image.py): 1 and 2 peers over 1 ms of
delay at ``--image-batch`` (64,256), rounds alternating 1 and 2 peers, into its own section.

Needs root (network namespaces). It re-executes itself in a private namespace (the server's),
so nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._proc import wait_for_log

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BRIDGE, SUBNET = "dcbr", "10.78.0"
SERVER_IP = f"{SUBNET}.1"
NCPU = os.cpu_count() or 1

CHILD = r'''
set -e
while ! ip link show eth0 >/dev/null 2>&1; do sleep 0.01; done
ip link set lo up
ip addr add "$1/24" dev eth0
ip link set eth0 up
ip route add default via %s
if [ -n "$3" ]; then tc qdisc add dev eth0 root tbf rate "$3" burst 64kb latency 50ms; fi
shift 3
exec "$@"
''' % SERVER_IP


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def setup_bridge() -> None:
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{SERVER_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")


_NEXT = [0]


class Device:
    """A process in its own network namespace on core ``core``, at 10.78.0.(10 + slot)."""

    def __init__(self, slot: int, core: int, cmd: list[str], rate: str, env: dict, log: Path):
        self.slot, self.ip = slot, f"{SUBNET}.{10 + slot}"
        self.log = log
        self.err = open(log, "w")
        _NEXT[0] += 1
        self.veth = f"vh{_NEXT[0]}"
        self.proc = subprocess.Popen(
            ["unshare", "-n", "--", "bash", "-c", CHILD, "bash", self.ip, str(core), rate,
             "taskset", "-c", str(core % NCPU), PY, str(ROOT / "bench" / "scaling_peer.py"), *cmd],
            cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=self.err, text=True)
        mine = os.readlink("/proc/self/ns/net")
        end = time.monotonic() + 10
        while time.monotonic() < end:  # unshare has run once the namespace differs
            try:
                if os.readlink(f"/proc/{self.proc.pid}/ns/net") != mine:
                    break
            except OSError:
                pass
            time.sleep(0.005)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns",
           str(self.proc.pid))
        sh("ip", "link", "set", self.veth, "master", BRIDGE)
        sh("ip", "link", "set", self.veth, "up")
        if rate:
            sh("tc", "qdisc", "add", "dev", self.veth, "root", "tbf", "rate", rate, "burst", "64kb",
               "latency", "50ms")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float):
        return wait_for_log(self.proc, self.stderr, pattern, timeout)

    def finish(self, timeout: float) -> str:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise RuntimeError(f"{self.log.name} ran past {timeout:.0f} s: {self.stderr()[-500:]}")
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.log.name} exited {self.proc.returncode}: {self.stderr()[-800:]}")
        return out


def split_timings(timings: list[dict]) -> tuple[float, int, list[dict]]:
    """(seconds per step, steps in the window, each peer's time per step in each hook) over
    the host's commits after the first ones (start-up: ICE, numba, sync)."""
    commits = timings[0]["commits"]
    skip = min(10, len(commits) // 4)  # the first steps include start-up (ICE, numba, sync)
    t0, t1 = commits[skip], commits[-1]
    steps = len(commits) - 1 - skip
    step_s = (t1 - t0) / max(1, steps)
    per_peer = []
    for t in timings:  # each peer's time per step in each hook, over the same window
        per_peer.append({k: sum(d for e, d in t[k] if t0 < e <= t1) / steps
                         for k in ("compute_cpu", "compute_wall", "encode", "decode", "apply",
                                   "messages_out", "messages_in")})
        per_peer[-1]["bytes_out"] = sum(d for e, d in t.get("bytes_out", []) if t0 < e <= t1) / steps
        cc, cm = t.get("commit_cpu"), t["commits"]
        if cc and len(cc) == len(cm):  # process CPU (all threads) per step over the window
            a = next(i for i, e in enumerate(cm) if e >= t0)
            per_peer[-1]["process_cpu"] = (cc[-1] - cc[a]) / max(1, len(cm) - 1 - a)
    return step_s, steps, per_peer


def run_mesh(tmp: Path, n: int, run_args: list[str], rate: str, delay_ms: float, tag: str,
             aggregate: str = "star") -> dict:
    """One room of ``n`` daisy-peers (host + n-1 members) on cores 0..n-1 (modulo the cores
    there are), summing each step by ``aggregate`` (star | ring): steps/s, the step split of
    each peer, wire bytes, the final hash."""
    port = 8790
    server = subprocess.Popen([str(Path(PY).parent / "daisychain"), "serve", "--host", SERVER_IP,
                               "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()
        if "DaisyChain serving on" not in line:
            raise RuntimeError(f"the server did not start: {line}")
        url = f"http://{SERVER_IP}:{port}"
        env = {"SCALING_DELAY_MS": str(delay_ms) if delay_ms else ""}
        prof = os.environ.get("SCALING_PROFILE_DIR")
        common = ["--server", url, "--capacity", "100", "--verify-rate", "0", "--aggregate", aggregate,
                  "--json", "--quiet", *run_args]
        devs = [Device(0, 0, ["peer", *common, "--name", "h", "--create-room", "--approve", "all",
                              "--wait-peers", str(n - 1)], rate,
                       {**env, "SCALING_OUT": str(tmp / f"{tag}-0.json"),
                        **({"SCALING_PROFILE": f"{prof}/{tag}-0.prof"} if prof else {})},
                       tmp / f"{tag}-0.err")]
        if n > 1:
            m = devs[0].wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})", 120)
            if not m:
                raise RuntimeError("the host made no room: " + devs[0].stderr()[-500:])
            for i in range(1, n):
                devs.append(Device(i, i, ["peer", *common, "--name", f"m{i}", "--room", m.group(1)],
                                   rate, {**env, "SCALING_OUT": str(tmp / f"{tag}-{i}.json"),
                                          **({"SCALING_PROFILE": f"{prof}/{tag}-{i}.prof"} if prof else {})},
                                   tmp / f"{tag}-{i}.err"))
        outs = [d.finish(900) for d in devs]
    finally:
        server.kill()
        server.wait(10)
    summaries = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    timings = [json.loads((tmp / f"{tag}-{i}.json").read_text()) for i in range(n)]
    step_s, steps, per_peer = split_timings(timings)
    # bytes all peers queued on their links per step, over the same window (the start-up
    # state transfer left out); the summaries' totals include it
    sent = sum(p["bytes_out"] for p in per_peer)
    return {"n": n, "step_s": step_s, "steps": len(timings[0]["commits"]), "peers": per_peer,
            "bytes_per_step": sent,
            "hash": summaries[0].get("params_sha256"),
            "hashes_agree": len({s.get("params_sha256") for s in summaries}) == 1}


def raw_probe(tmp: Path, nbytes: int, rate: str, delay_ms: float, tag: str) -> dict:
    folder = tmp / f"raw-{tag}"
    folder.mkdir()
    env = {"SCALING_DELAY_MS": str(delay_ms) if delay_ms else ""}
    a = Device(0, 0, ["raw", "offer", str(folder), str(nbytes)], rate, env, tmp / f"raw-{tag}-0.err")
    b = Device(1, 1, ["raw", "answer", str(folder), str(nbytes)], rate, env, tmp / f"raw-{tag}-1.err")
    out = a.finish(120)
    b.finish(60)
    return json.loads(out.split("RESULT ", 1)[1])


def gloo_probe(tmp: Path, n: int, rate: str, tag: str) -> dict:
    addr = f"{SUBNET}.10"
    env = {"GLOO_SOCKET_IFNAME": "eth0"}
    a = Device(0, 0, ["gloo", "0", addr, str(n)], rate, env, tmp / f"gloo-{tag}-0.err")
    b = Device(1, 1, ["gloo", "1", addr, str(n)], rate, env, tmp / f"gloo-{tag}-1.err")
    out = a.finish(120)
    b.finish(60)
    return json.loads(out.split("RESULT ", 1)[1])


NET_NAMES = {"veth": "veth (no cap, no delay)", "tbf": "100 Mbit/s (tbf)",
             "delay": "1 ms each way (user space)"}


def _split(r: dict) -> tuple[float, float]:
    """(the slowest peer's own work per step, the rest of the step: wire + waiting)."""
    work = max(p["compute_wall"] + p["encode"] + p["decode"] + p["apply"] for p in r["peers"])
    return work, max(0.0, r["step_s"] - work)


def star_model(n: int, mb_s: float, n_micro: int, per_msg_s: float, per_byte_s: float,
               up_bytes: float, down_bytes: float) -> float:
    """Step time of the star (coordinator) protocol on n devices (see the formula in the
    report): compute of n_micro / n micro-batches, two one-way message costs, and the
    coordinator's serial handling of (n - 1) contributions in and (n - 1) totals out."""
    if n == 1:
        return n_micro * mb_s
    return (math.ceil(n_micro / n) * mb_s + 2 * per_msg_s
            + (n - 1) * (2 * per_msg_s + per_byte_s * (up_bytes + down_bytes)))


def ring_model(n: int, mb_s: float, n_micro: int, per_msg_s: float, per_byte_s: float,
               nbytes: float) -> float:
    """Ring reduce-scatter + all-gather: 2 (n - 1) hops of nbytes / n each."""
    if n == 1:
        return n_micro * mb_s
    return math.ceil(n_micro / n) * mb_s + 2 * (n - 1) * (per_msg_s + per_byte_s * nbytes / n)


def tree_model(n: int, mb_s: float, n_micro: int, per_msg_s: float, per_byte_s: float,
               nbytes: float) -> float:
    """Binary tree reduce + broadcast: 2 ceil(log2 n) hops of the whole vector."""
    if n == 1:
        return n_micro * mb_s
    return math.ceil(n_micro / n) * mb_s + 2 * math.ceil(math.log2(n)) * (per_msg_s + per_byte_s * nbytes)


def report(results: dict) -> str:
    import numpy as np

    mesh = results["mesh"]
    one = {(r["net"], r["run"]): r for r in mesh if r["n"] == 1}
    batch = results["meta"].get("batch") or {"default": 64, "compute-bound": results["meta"].get("big_batch", 1024)}
    lines = ["| run | network | peers | samples/s | vs 1 peer | step ms | slowest peer's work ms "
             "(compute / encode / decode / apply) | wire + waiting ms | messages out / in per step (each peer) "
             "| process CPU per step ms (each peer) | load after | same hash as 1 peer |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in mesh:
        base = one[(r["net"], r["run"])]
        work, rest = _split(r)
        slow = max(r["peers"], key=lambda p: p["compute_wall"] + p["encode"] + p["decode"] + p["apply"])
        msgs = ", ".join(f"{p['messages_out']:.1f} / {p['messages_in']:.1f}" for p in r["peers"])
        cpu = ", ".join(f"{p['process_cpu'] * 1e3:.1f}" if "process_cpu" in p else "n/a" for p in r["peers"])
        lines.append(
            f"| {r['run']} | {NET_NAMES[r['net']]} | {r['n']} | {batch[r['run']] / r['step_s']:,.0f} | "
            f"{base['step_s'] / r['step_s']:.2f}x | {r['step_s'] * 1e3:.2f} | {work * 1e3:.2f} "
            f"({slow['compute_wall'] * 1e3:.2f} / {slow['encode'] * 1e3:.2f} / {slow['decode'] * 1e3:.2f}"
            f" / {slow['apply'] * 1e3:.2f}) | {rest * 1e3:.2f} | "
            f"{msgs} | {cpu} | {r.get('load', float('nan')):.1f} | "
            f"{'yes' if r['hash'] == base['hash'] and r['hashes_agree'] else 'NO'} |")
    over = ["| run | network | step overhead at 2 peers ms | raw RTT ms | raw rate MB/s | payload B/step "
            "| bound: 2 RTT + payload / rate ms | within bound | Gloo all-reduce int64 / float32 ms |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in mesh:
        if r["n"] != 2:
            continue
        raw = results["raw"][r["net"]][r["run"]]
        base = one[(r["net"], r["run"])]
        # overhead: the 2-peer step minus its compute (the slowest peer's compute wall time)
        overhead = r["step_s"] - max(p["compute_wall"] for p in r["peers"])
        bound = 2 * raw["rtt_s"] + r["bytes_per_step"] / raw["rate_Bps"]
        g = results["gloo"].get(r["net"], {}).get(r["run"])
        gl = f"{g['int64'] * 1e3:.2f} / {g['float32'] * 1e3:.2f}" if g else "n/a (TCP: no user-space delay)"
        over.append(f"| {r['run']} | {NET_NAMES[r['net']]} | {overhead * 1e3:.2f} | {raw['rtt_s'] * 1e3:.2f} | "
                    f"{raw['rate_Bps'] / 1e6:.2f} | {r['bytes_per_step']:,.0f} | {bound * 1e3:.2f} | "
                    f"{'yes' if overhead <= bound else 'no'} ({overhead / bound:.1f}x) | {gl} |")
    text = [f"Machine: {results['meta']['cpus']} cores; 1-minute load average {results['meta']['load_start'][0]:.1f} "
            f"at the start and {results['meta'].get('load_end', [float('nan')])[0]:.1f} at the end "
            "(the machine is shared with other work: absolute times are inflated, and more so "
            "the more wake-ups a step needs).", "",
            "Each peer: its own process, network namespace (veth to a bridge in the server's "
            "namespace) and core (taskset); the same capacity (`--capacity 100`: the same "
            "speed, so the first steps split evenly; once the coordinator has timed itself and "
            "its member it splits so that both finish together, docs/MESH.md), `--verify-rate 0`, "
            "one BLAS thread. default = the digits defaults (hidden 128, batch 64 = 4 "
            "micro-batches); compute-bound NNk = `--layers 256,256 --batch NNk --micro-batch "
            "max(64, NNk / 256)` (256 micro-batches a step). Steps/s from the host's "
            "commit times after the first steps. Work = each peer's own time per step in "
            "contribute (compute, wall), encode_frames, from_message and Trainer.apply; wire + "
            "waiting = step minus the slowest peer's work.", "", *lines, "",
            "Step overhead = the 2-peer step minus the slowest peer's compute; raw RTT = median "
            "round trip of a 32-byte message on one aiortc data channel between the two "
            "namespaces, raw rate = median rate of a transfer of one step's wire bytes, both "
            "in the same run and network; Gloo = torch.distributed all-reduce of the model's "
            "parameter count between the same two namespaces (TCP).", "", *over]
    text += ["", extrapolation(results)]
    return "\n".join(text)


def extrapolation(results: dict) -> str:
    """Item 6: the star against a ring and a tree for 1..16 devices, from the costs measured."""
    rows = []
    for run in dict.fromkeys(r["run"] for r in results["mesh"]):
        r1 = next((r for r in results["mesh"] if r["run"] == run and r["n"] == 1 and r["net"] == "veth"), None)
        r2 = next((r for r in results["mesh"] if r["run"] == run and r["n"] == 2 and r["net"] == "veth"), None)
        raw = results["raw"].get("veth", {}).get(run)
        if not (r1 and r2 and raw):
            continue
        n_micro = results["meta"]["n_micro"][run]
        mb_s = r1["peers"][0]["compute_wall"] / n_micro
        per_msg = raw["rtt_s"] / 2  # one message, one way, incl. both ends' handling
        per_byte = 1.0 / raw["rate_Bps"]
        up = down = r2["bytes_per_step"] / 2  # one contribution up, one total down per member
        rows.append((run, n_micro, mb_s, per_msg, per_byte, up, down, up))
    if not rows:
        return ""
    out = ["### Extrapolation to 4-16 devices (a model, not a measurement)", "",
           "From the veth run above: c = compute per micro-batch (1 peer), a = one message one "
           "way = raw RTT / 2, b = seconds per byte = 1 / raw rate, P = bytes one member sends "
           "(and receives) per step at 2 peers, M = micro-batches per step, V = the bytes of one "
           "whole vector in the ring and the tree, taken as P (the same compression; partial "
           "sums may compress less well).", "",
           "* star (today): T(n) = ceil(M/n) c + 2a + (n-1) (2a + 2P b)  (one message each way "
           "on the critical path, and the coordinator handles every contribution and every "
           "total, one after another, on its one link: its upload is (n-1) P per step)",
           "* ring reduce-scatter + all-gather: T(n) = ceil(M/n) c + 2(n-1) (a + b V/n)",
           "* tree reduce + broadcast: T(n) = ceil(M/n) c + 2 ceil(log2 n) (a + b V)", "",
           "| run | n | star ms | ring ms | tree ms | best | coordinator upload per step |", "|---|---|---|---|---|---|---|"]
    for run, n_micro, c, a, b, up, down, vbytes in rows:
        for n in (1, 2, 4, 8, 16):
            st = star_model(n, c, n_micro, a, b, up, down)
            ri = ring_model(n, c, n_micro, a, b, vbytes)
            tr = tree_model(n, c, n_micro, a, b, vbytes)
            best = min((st, "star"), (ri, "ring"), (tr, "tree"))
            out.append(f"| {run} | {n} | {st * 1e3:.2f} | {ri * 1e3:.2f} | {tr * 1e3:.2f} | "
                       f"{best[1]} ({st / best[0]:.2f}x faster than the star) | {(n - 1) * down / 1e3:.1f} kB |")
        out.append(f"| {run} | params | c = {c * 1e3:.3f} ms, a = {a * 1e3:.2f} ms, "
                   f"b = {b * 1e9:.1f} ns/B, P = {up:,.0f} B, M = {n_micro}, V = {vbytes:,.0f} B | | | | |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="steps of the default run")
    ap.add_argument("--big-steps", type=int, default=30, help="steps of the compute-bound run")
    ap.add_argument("--big-batch", type=_batches, default="16384,32768,65536",
                    help="batch of the compute-bound run; a comma-separated list is a sweep")
    ap.add_argument("--big-micro", type=int, default=64,
                    help="smallest micro-batch of the compute-bound run (at least batch / 256, "
                         "so a step has at most 256 micro-batches: with more, the clamp bound "
                         "2**51 / n_micro drops the engine's weight gradient from its one folded "
                         "GEMM to one float64 GEMM per micro-batch, ~3x slower per sample)")
    ap.add_argument("--nets", default=None, help="networks to run (comma-separated; default veth,tbf,delay, "
                    "with --task image delay)")
    ap.add_argument("--out", default=None, help="also write the raw results (JSON) here")
    ap.add_argument("--report", default=None, help="only rewrite the report from a --out file")
    ap.add_argument("--raw", default=None, metavar="DIR",
                    help="with --report: recompute the step splits from the peers' timing files in DIR")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="only a 2-peer default run on the veth, each peer under cProfile (stats in DIR)")
    ap.add_argument("--runs", default="default,compute-bound", help="runs (comma-separated)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--task", default=None, choices=("image", "text"),
                    help="image: the CNN rows instead (1 and 2 peers, --nets, --image-batch); text: "
                         "the same rows for the text transformer (--layers, --context; batch 64, "
                         "with and without local steps)")
    ap.add_argument("--layers", default=None, help="with --task image: the model (default: the image default "
                    "CNN); with --task text: the blocks (default block64h4,block64h4)")
    ap.add_argument("--context", type=int, default=32, help="with --task text: the context window")
    ap.add_argument("--image-batch", type=_batches, default="64,256", help="with --task image: batches")
    ap.add_argument("--image-steps", type=int, default=60, help="with --task image: steps at batch 64 "
                    "(fewer at larger batches: 64 * this / batch, at least 24)")
    ap.add_argument("--switch-s", type=float, default=None,
                    help="with --task image: each round also runs 2 peers with this sys.setswitchinterval")
    ap.add_argument("--sctp-burst", type=int, default=None,
                    help="with --task image: each round also runs 2 peers whose aiortc SCTP bursts "
                         "this many chunks instead of 4 (an experiment), and probes the raw channel so")
    ap.add_argument("--rounds", type=int, default=2, help="with --task image: rounds, each 1 then 2 peers")
    ap.add_argument("--aggregate", default=None, metavar="star,ring",
                    help="rooms of 2+ peers once per aggregation named (bench/scaling_ring.py: "
                         "its own section, no raw / Gloo probes; default: the star only, as above)")
    ap.add_argument("--peers", default="1,2", help="with --aggregate: room sizes (default 1,2)")
    args = ap.parse_args()
    if args.aggregate and args.task != "image":  # with --task image: a 2-peer variant per aggregation
        from bench.scaling_ring import main_ring
        main_ring(args)
        return
    if args.task in ("image", "text") and not args.report:
        if os.environ.get("DAISY_SCALING_NS") != "1":
            os.execvp("unshare", ["unshare", "-n", "--", "env", "DAISY_SCALING_NS=1", PY, "-m",
                                  "bench.scaling", *sys.argv[1:]])
        setup_bridge()
        from bench.scaling_image import main_image
        main_image(args)
        return
    if args.report:
        results = json.loads(Path(args.report).read_text())
        if "layers" in results["meta"]:  # a --task image run
            from bench.scaling_image import report_image, section_of
            text = report_image(results)
            print(text)
            if not args.no_write:
                from bench._report import write_section
                write_section(section_of(results["meta"]), text, "sudo .venv/bin/python -m bench.scaling " + " ".join(sys.argv[1:]))
            return
        if args.raw:
            for r in results["mesh"]:
                tag = f"{r['net']}-{r['run']}-{r['n']}"
                files = [Path(args.raw) / f"{tag}-{i}.json" for i in range(r["n"])]
                if all(f.exists() for f in files):
                    r["step_s"], _, r["peers"] = split_timings([json.loads(f.read_text()) for f in files])
        text = report(results)
        print(text)
        if not args.no_write:
            from bench._report import write_section
            write_section("scaling", text, "sudo .venv/bin/python -m bench.scaling " + " ".join(sys.argv[1:]))
        return
    if os.environ.get("DAISY_SCALING_NS") != "1":
        os.execvp("unshare", ["unshare", "-n", "--", "env", "DAISY_SCALING_NS=1", PY, "-m",
                              "bench.scaling", *sys.argv[1:]])
    setup_bridge()
    if args.profile:
        os.environ["SCALING_PROFILE_DIR"] = str(Path(args.profile).resolve())
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="dc-scaling-"))
        r = run_mesh(tmp, 2, ["--steps", str(args.steps)], "", 0.0, "profile")
        print(json.dumps(r, indent=1))
        shutil.rmtree(tmp, ignore_errors=True)
        return
    nets = {"veth": ("", 0.0), "tbf": ("100mbit", 0.0), "delay": ("", 1.0)}
    runs = {"default": ["--steps", str(args.steps)]}
    batches = {}
    for b in args.big_batch.split(","):  # a sweep: where a second device starts to pay
        name = "compute-bound" if "," not in args.big_batch else f"compute-bound {int(b) // 1024}k"
        batches[name] = int(b)
        runs[name] = ["--steps", str(args.big_steps), "--layers", "256,256", "--batch", b,
                      "--micro-batch", str(max(args.big_micro, int(b) // 256))]
    runs = {k: v for k, v in runs.items() if k.split(" ")[0] in args.runs.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="dc-scaling-"))
    results = {"meta": {"cpus": NCPU, "load_start": os.getloadavg(),
                        "batch": {"default": 64, **batches},
                        "n_micro": {run: _settings(rargs).hp.n_micro for run, rargs in runs.items()},
                        "params": {run: _params(rargs) for run, rargs in runs.items()}},
               "mesh": [], "raw": {}, "gloo": {}}
    try:
        for net in (args.nets or "veth,tbf,delay").split(","):
            rate, delay = nets[net]
            for run, rargs in runs.items():
                for n in (1, 2):
                    tag = f"{net}-{run}-{n}"
                    print(f"[scaling] {tag}", file=sys.stderr, flush=True)
                    r = run_mesh(tmp, n, rargs, rate, delay, tag)
                    r.update(net=net, run=run, load=os.getloadavg()[0])
                    results["mesh"].append(r)
                    print(f"[scaling] {tag}: {1 / r['step_s']:.1f} steps/s", file=sys.stderr, flush=True)
            two = [r for r in results["mesh"] if r["net"] == net and r["n"] == 2]
            results["raw"][net] = {r["run"]: raw_probe(tmp, int(r["bytes_per_step"]), rate, delay,
                                                       f"{net}-{r['run']}") for r in two}
            if not delay:  # Gloo is TCP: the datagram delay does not apply to it
                results["gloo"][net] = {run: gloo_probe(tmp, results["meta"]["params"][run], rate,
                                                        f"{net}-{run}") for run in runs}
        results["meta"]["load_end"] = os.getloadavg()
    finally:
        if not os.environ.get("SCALING_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    text = report(results)
    print(text)
    if not args.no_write:
        from bench._report import write_section
        write_section("scaling", text, "sudo .venv/bin/python -m bench.scaling " + " ".join(sys.argv[1:]))


def _batches(text: str) -> str:
    """``--big-batch``: one or more positive batch sizes, comma-separated."""
    try:
        if all(int(b) > 0 for b in text.split(",")):
            return text
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--big-batch takes batch sizes such as 16384,32768, not {text!r}")


def _settings(run_args: list[str]):
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    ap = argparse.ArgumentParser()
    add_run_arguments(ap, steps=1)
    return settings_from_args(ap.parse_args(run_args))


def _params(run_args: list[str]) -> int:
    """Parameter count of a run's model."""
    import numpy as np
    return sum(int(np.prod(s)) for _, s in _settings(run_args).spec.param_shapes())


if __name__ == "__main__":
    main()
