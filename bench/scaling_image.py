"""``bench.scaling --task image``: the CNN on 1 and 2 ``daisy-peer`` processes (each in its own
network namespace, on its own core), over 1 ms of delay each way by default, at batch 64 and
256. Rounds alternate 1 and 2 peers at every batch, so that each ratio pairs runs measured
minutes apart at most on a shared machine; the report gives every round and the median.

Where a 2-peer step goes, per peer: compute (wall time in contribute_at), encode (frames out),
decode (frames in), apply (Adam), and the rest of the step (wire + waiting for the other
peer); the coordinator is peer 0.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.scaling import NET_NAMES, raw_probe, run_mesh

NETS = {"veth": ("", 0.0), "tbf": ("100mbit", 0.0), "delay": ("", 1.0)}


def image_runs(layers: str | None, batches: str, steps64: int) -> dict[str, list[str]]:
    runs = {}
    for b in (int(x) for x in batches.split(",")):
        steps = max(24, steps64 * 64 // b)
        runs[f"batch {b}"] = ["--task", "image", "--batch", str(b), "--steps", str(steps),
                              *(["--layers", layers] if layers else [])]
    return runs


def text_runs(layers: str | None, context: int, steps: int) -> dict[str, list[str]]:
    """``--task text``: the transformer at batch 64 (4 micro-batches of 16), and the same with
    local steps (2 replicas, an outer step every 4 inner steps)."""
    base = ["--task", "text", "--context", str(context), "--layers", layers or "block64h4,block64h4",
            "--batch", "64", "--steps", str(steps)]
    return {"batch 64": base, "batch 64, local steps (2 replicas, sync every 4)":
            base + ["--replicas", "2", "--sync-every", "4"]}


def section_of(meta: dict) -> str:
    return "scaling-gpt" if meta.get("task") == "text" else "scaling-image"


def main_image(args) -> None:
    from bench.scaling import _params, _settings

    nets = (args.nets or "delay").split(",")
    text = args.task == "text"
    runs = (text_runs(args.layers, args.context, args.image_steps) if text
            else image_runs(args.layers, args.image_batch, args.image_steps))
    tmp = Path(tempfile.mkdtemp(prefix="dc-scaling-image-"))
    first = next(iter(runs.values()))
    spec = _settings(first).spec
    variants = ([("SCALING_SWITCH_S", str(args.switch_s))] if args.switch_s else []) + \
        ([("SCALING_SCTP_BURST", str(args.sctp_burst))] if args.sctp_burst else []) + \
        [("AGGREGATE", a) for a in (args.aggregate or "").split(",") if a and a != "star"]
    results = {"meta": {"cpus": os.cpu_count(), "load_start": os.getloadavg(), "task": args.task,
                        "layers": (args.layers or ("block64h4,block64h4" if text else "(image default)"))
                        + (f" --context {args.context}" if text else ""),
                        "model": " ".join(l.type for l in spec.layers if l.type != "relu"),
                        "params": _params(first),
                        "n_micro": {r: _settings(a).hp.n_micro for r, a in runs.items()},
                        "batch": {r: _settings(a).hp.batch for r, a in runs.items()}},
               "mesh": []}
    try:
        for rnd in range(args.rounds):
            for net in nets:
                rate, delay = NETS[net]
                for run, rargs in runs.items():
                    for n, var in ((1, None), (2, None), *((2, v) for v in variants)):
                        tag = f"img-{rnd}-{net}-{run.replace(' ', '')}-{n}{'-' + var[0] if var else ''}"
                        print(f"[scaling] {tag}", file=sys.stderr, flush=True)
                        agg = var[1] if var and var[0] == "AGGREGATE" else "star"
                        env = var if var and var[0] != "AGGREGATE" else None
                        if env:  # each daisy-peer's experiment (bench/scaling_peer.py)
                            os.environ[env[0]] = env[1]
                        try:
                            r = run_mesh(tmp, n, rargs, rate, delay, tag, agg)
                        finally:
                            if env:
                                os.environ.pop(env[0], None)
                        r.update(net=net, run=run, round=rnd, load=os.getloadavg()[0],
                                 switch_s=float(var[1]) if var and var[0] == "SCALING_SWITCH_S" else None,
                                 variant=f"{var[0]}={var[1]}" if var else None)
                        results["mesh"].append(r)
                        print(f"[scaling] {tag}: {r['step_s'] * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
        results["raw"] = {}
        for net in nets:  # the data channel alone, same network: one contribution's bytes
            rate, delay = NETS[net]
            two = [r for r in results["mesh"] if r["net"] == net and r["n"] == 2]
            one_msg = int(max(p["bytes_out"] for p in two[-1]["peers"]))
            results["raw"][net] = {"bytes": one_msg, **raw_probe(tmp, one_msg, rate, delay, f"img-{net}")}
            if args.sctp_burst:  # the same probe with the experiment's burst
                os.environ["SCALING_SCTP_BURST"] = str(args.sctp_burst)
                try:
                    results["raw"][f"{net} burst {args.sctp_burst}"] = {
                        "bytes": one_msg, **raw_probe(tmp, one_msg, rate, delay, f"img-{net}-burst")}
                finally:
                    os.environ.pop("SCALING_SCTP_BURST", None)
        results["meta"]["load_end"] = os.getloadavg()
    finally:
        if not os.environ.get("SCALING_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    report = report_image(results)
    print(report)
    if not args.no_write:
        from bench._report import write_section
        write_section(section_of(results["meta"]), report, "sudo .venv/bin/python -m bench.scaling " + " ".join(sys.argv[1:]))


def _label(r: dict) -> str | None:
    """A 2-peer row's experiment, in words (None: daisy-peer as shipped)."""
    if r.get("switch_s"):
        return f"switch interval {r['switch_s'] * 1e3:g} ms"
    if (r.get("variant") or "").startswith("AGGREGATE="):
        return f"summed by the {r['variant'].split('=')[1]}"
    if (r.get("variant") or "").startswith("SCALING_SCTP_BURST="):
        return f"SCTP burst {r['variant'].split('=')[1]} chunks"
    return None


def _work(p: dict) -> float:
    return p["compute_wall"] + p["encode"] + p["decode"] + p["apply"]


def report_image(results: dict) -> str:
    meta, mesh = results["meta"], results["mesh"]
    ratios: dict = {}
    rows = ["| round | run | network | peers | samples/s | step ms | vs 1 peer (same round) | "
            "per peer: compute / encode / decode / apply / wire + waiting ms (peer 0 = coordinator) "
            "| wire bytes per step | load | same hash as 1 peer |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in mesh:
        base = next(b for b in mesh if b["n"] == 1 and b["run"] == r["run"] and b["net"] == r["net"]
                    and b["round"] == r["round"])
        ratio = base["step_s"] / r["step_s"]
        if r["n"] == 2:
            ratios.setdefault((r["run"], r["net"], _label(r)), []).append(ratio)
        split = "; ".join(f"{p['compute_wall'] * 1e3:.1f} / {p['encode'] * 1e3:.1f} / {p['decode'] * 1e3:.1f}"
                          f" / {p['apply'] * 1e3:.1f} / {max(0.0, r['step_s'] - _work(p)) * 1e3:.1f}"
                          for p in r["peers"])
        same = r["hash"] == base["hash"] and r["hashes_agree"]
        peers = f"{r['n']}" + (f" ({_label(r)})" if _label(r) else "")
        rows.append(f"| {r['round'] + 1} | {r['run']} | {NET_NAMES[r['net']]} | {peers} | "
                    f"{meta['batch'][r['run']] / r['step_s']:,.0f} | {r['step_s'] * 1e3:.1f} | {ratio:.2f}x | "
                    f"{split} | {r['bytes_per_step']:,.0f} | {r['load']:.1f} | {'yes' if same else 'NO'} |")
    summary = ["| run | network | 2 peers | 2 peers vs 1, each round | median | goal (issue 19) |",
               "|---|---|---|---|---|---|"]
    goal = {} if meta.get("task") == "text" else {64: 1.3, 256: 1.6}  # issue 19: the CNN
    for (run, net, sw), rs in ratios.items():
        g = goal.get(meta["batch"][run])
        med = statistics.median(rs)
        how = sw or "as shipped"
        summary.append(f"| {run} | {NET_NAMES[net]} | {how} | {', '.join(f'{x:.2f}x' for x in rs)} | {med:.2f}x | "
                       + (f">= {g}x: {'met' if med >= g else 'NOT met'}" if g else "") + " |")
    limit = ["| run | network | compute per micro-batch c ms (1 peer) | micro-batches M | "
             "link L ms (2 peers: member's step minus its own work) | best a 2-peer star allows: "
             "T1 / max((M c + L) / 2, L + c) | measured (median) |", "|---|---|---|---|---|---|---|"]
    for (run, net, sw), rs in ratios.items():
        ones = [r for r in mesh if r["run"] == run and r["net"] == net and r["n"] == 1]
        twos = [r for r in mesh if r["run"] == run and r["net"] == net and r["n"] == 2
                and _label(r) == sw]
        m = meta["n_micro"][run]
        c = statistics.median(r["peers"][0]["compute_wall"] for r in ones) / m
        link = statistics.median(r["step_s"] - r["peers"][1]["compute_wall"] for r in twos)
        t1 = statistics.median(r["step_s"] for r in ones)
        best = t1 / max((m * c + link) / 2, link + c)
        limit.append(f"| {run}{f' ({sw})' if sw else ''} | {NET_NAMES[net]} | {c * 1e3:.2f} | {m} | {link * 1e3:.1f} | {best:.2f}x | "
                     f"{statistics.median(rs):.2f}x |")
    raw = "; ".join(f"{NET_NAMES.get(net.split(' ')[0])}{net[len(net.split(' ')[0]):]}: round trip of 32 B {x['rtt_s'] * 1e3:.2f} ms, one "
                    f"{x['bytes']:,} B message {x['bytes'] / x['rate_Bps'] * 1e3:.1f} ms "
                    f"({x['rate_Bps'] / 1e6:.1f} MB/s)" for net, x in results.get("raw", {}).items())
    return "\n".join([
        f"Model: `--task {meta.get('task') or 'image'}` {meta['layers']} ({meta['model']}; {meta['params']:,} parameters), "
        f"micro-batches per step: " + ", ".join(f"{k}: {v}" for k, v in meta["n_micro"].items()) + ". "
        f"Machine: {meta['cpus']} cores shared with other work; 1-minute load average "
        f"{meta['load_start'][0]:.1f} at the start and {meta.get('load_end', [float('nan')])[0]:.1f} at the end.",
        "",
        "Each peer: its own `daisy-peer` process, network namespace and core (taskset), "
        "`--capacity 100 --verify-rate 0`, one BLAS thread; 1 ms each way is added in user "
        "space to every data datagram. Rounds alternate 1 and 2 peers at each batch; a ratio "
        "compares the 1- and 2-peer runs of one round. Step = the host's commit interval after "
        "the first steps; per peer, compute = wall time in contribute_at, encode/decode = "
        "frames out/in, apply = Adam, wire + waiting = step minus that peer's own work.",
        "", *summary, "", *rows, "",
        "What bounds the 2-peer step: every step the member must receive the total, compute "
        "its share and send its contribution back, so with the coordinator computing the rest "
        "meanwhile (the finish-together split) and the member taking at least one micro-batch, "
        "T2 >= max((M c + L) / 2, L + c), where L is "
        "the member's link time per step (total down + contribution up + both ends' handling). "
        "The raw data channel in the same run: " + (raw or "not measured") + ".", "", *limit])
