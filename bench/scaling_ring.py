"""``bench.scaling --aggregate star,ring``: the same rooms of real ``daisy-peer`` processes as
bench/scaling.py (own network namespace and core each, a veth to the server's bridge), once
summing each step by the star (every contribution to the coordinator, the total back) and
once by the ring (reduce-scatter + all-gather between the members, daisychain/peer/run/ring.py),
in the same run, rounds alternating the two; then the per-hop costs measured, and the star
and the ring extrapolated to 4-16 devices from them.

    sudo .venv/bin/python -m bench.scaling --aggregate star,ring --peers 1,2,3 --steps 150

Writes the ``scaling-ring`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.scaling import NCPU, PY, _settings, run_mesh, setup_bridge


def main_ring(args) -> None:
    if args.report:  # one results file, or several (comma-separated) merged
        parts = [json.loads(Path(f).read_text()) for f in args.report.split(",")]
        results = parts[0]
        for extra in parts[1:]:
            results["mesh"] += extra["mesh"]
            for k in ("batch", "n_micro"):
                results["meta"][k].update(extra["meta"][k])
            results["meta"]["rounds"] = f"{results['meta']['rounds']} / {extra['meta']['rounds']}"
            results["meta"]["load_end"] = extra["meta"].get("load_end")
    else:
        if os.environ.get("DAISY_SCALING_NS") != "1":
            os.execvp("unshare", ["unshare", "-n", "--", "env", "DAISY_SCALING_NS=1", PY, "-m",
                                  "bench.scaling", *sys.argv[1:]])
        setup_bridge()
        results = measure(args)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
    text = report_ring(results)
    print(text)
    if not args.no_write:
        from bench._report import write_section
        write_section("scaling-ring", text, "sudo .venv/bin/python -m bench.scaling " + " ".join(sys.argv[1:]))


def measure(args) -> dict:
    aggs = args.aggregate.split(",")
    sizes = [int(n) for n in args.peers.split(",")]
    runs = {"default": ["--steps", str(args.steps)]}
    b = args.big_batch.split(",")[0]
    runs["compute-bound"] = ["--steps", str(args.big_steps), "--layers", "256,256", "--batch", b,
                             "--micro-batch", str(max(args.big_micro, int(b) // 256))]
    runs = {k: v for k, v in runs.items() if k in args.runs.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="dc-scaling-ring-"))
    results = {"meta": {"cpus": NCPU, "load_start": os.getloadavg(), "rounds": args.rounds,
                        "batch": {"default": 64, "compute-bound": int(b)},
                        "n_micro": {run: _settings(rargs).hp.n_micro for run, rargs in runs.items()}},
               "mesh": []}
    try:
        for rnd in range(args.rounds):
            for run, rargs in runs.items():
                for n in sizes:
                    order = ["star"] if n == 1 else (aggs if rnd % 2 == 0 else aggs[::-1])
                    for agg in order:
                        tag = f"{run}-{n}-{agg}-{rnd}"
                        print(f"[scaling-ring] {tag}", file=sys.stderr, flush=True)
                        r = run_mesh(tmp, n, rargs, "", 0.0, tag, agg)
                        r.update(net="veth", run=run, aggregate=agg, round=rnd, load=os.getloadavg()[0])
                        results["mesh"].append(r)
                        print(f"[scaling-ring] {tag}: {1 / r['step_s']:.1f} steps/s", file=sys.stderr,
                              flush=True)
        results["meta"]["load_end"] = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def _rows(results) -> dict:
    """(run, n, aggregate) -> medians over the rounds of step, slowest compute, overhead."""
    out: dict = {}
    for r in results["mesh"]:
        key = (r["run"], r["n"], r["aggregate"])
        comp = max(p["compute_wall"] for p in r["peers"])
        out.setdefault(key, []).append({
            "step": r["step_s"], "compute": comp, "over": max(0.0, r["step_s"] - comp),
            "msgs": [(p["messages_out"], p["messages_in"]) for p in r["peers"]],
            "bytes": [p["bytes_out"] for p in r["peers"]], "load": r.get("load", float("nan")),
            "hash": r["hash"], "agree": r["hashes_agree"]})
    med = {}
    for key, rs in out.items():
        med[key] = {k: _median([x[k] for x in rs]) for k in ("step", "compute", "over", "load")}
        med[key].update(msgs=rs[0]["msgs"], bytes=rs[0]["bytes"], rounds=len(rs),
                        hashes={x["hash"] for x in rs}, agree=all(x["agree"] for x in rs))
    return med


def fit(med: dict, run: str) -> dict | None:
    """The costs of the hop model of daisychain/peer/run/ring.py from this run's rows:
    V = the wire bytes of one vector (the host's bytes out per step at 2 peers, star),
    b = seconds per wire byte (ring.py's: the raw rate of the veth run); from the star's
    overheads at 2 and 3 peers: s = over(3) - over(2) - 2Vb (one more member at the
    coordinator) and its hop h_star = (over(2) - s - 2Vb) / 2; from the ring's at each n:
    h_ring = (over(n) - 2 (n - 1) b V / n) / (2n - 1), the median over n; c = compute per
    micro-batch on one device."""
    from daisychain.peer.run.ring import LINK_B_S_PER_BYTE as b
    need = [(run, 1, "star"), (run, 2, "star"), (run, 3, "star")]
    rings = sorted(n for r, n, a in med if r == run and a == "ring")
    if not all(k in med for k in need) or not rings:
        return None
    v = med[(run, 2, "star")]["bytes"][0]
    s = max(0.0, med[(run, 3, "star")]["over"] - med[(run, 2, "star")]["over"] - 2 * v * b)
    h_star = max(0.0, (med[(run, 2, "star")]["over"] - s - 2 * v * b) / 2)
    hops = {n: (med[(run, n, "ring")]["over"] - 2 * (n - 1) * b * v / n) / (2 * n - 1) for n in rings}
    return {"v": v, "b": b, "s": s, "h_star": h_star, "hops": hops, "h_ring": _median(list(hops.values())),
            "c": med[(run, 1, "star")]["compute"]}


def extrapolate(med: dict, meta: dict) -> list[str]:
    """Per run: the star and the ring at 2-16 devices by ring.py's model, with this run's costs."""
    from daisychain.peer.run.ring import BYTES_PER_VALUE, ring_seconds, star_seconds
    out = []
    for run in dict.fromkeys(r for r, _, _ in med):
        f = fit(med, run)
        if f is None:
            continue
        n_micro = meta["n_micro"][run]
        c = f["c"] / n_micro
        size = f["v"] / BYTES_PER_VALUE
        hops = ", ".join(f"{f['hops'][n] * 1e3:.2f} ms at {n}" for n in sorted(f["hops"]))
        rows = [f"#### {run}: the star and the ring at 4-16 devices, from these costs (a model)", "",
                "The model of `daisychain/peer/run/ring.py` (what `--aggregate auto` uses): star "
                "T(n) = ceil(M/n) c + 2h + (n - 1) (s + 2Vb): two hops on the critical path and the "
                "coordinator's serial work per member; ring T(n) = ceil(M/n) c + (2n - 1) h + "
                "2 (n - 1) b V / n: the plan and 2 (n - 1) chunk hops one after another. From this "
                f"run: V = {f['v'] / 1e3:.1f} kB, b = {f['b'] * 1e9:.0f} ns/B, s = {f['s'] * 1e3:.2f} ms, "
                f"the star's hop h = {f['h_star'] * 1e3:.2f} ms, the ring's hop h = {f['h_ring'] * 1e3:.2f} ms "
                f"(median of {hops}), c = {c * 1e3:.3f} ms, M = {n_micro}.", "",
                "| n | star ms | ring ms | faster |", "|---|---|---|---|"]
        for n in (2, 3, 4, 8, 16):
            st = star_seconds(n, n_micro, c, size, f["h_star"], f["s"], f["b"])
            ri = ring_seconds(n, n_micro, c, size, f["h_ring"], f["b"])
            best = "ring" if ri < st else "star"
            rows.append(f"| {n} | {st * 1e3:.2f} | {ri * 1e3:.2f} | {best} ({max(st, ri) / min(st, ri):.2f}x) |")
        out.append("\n".join(rows))
    return out


def report_ring(results: dict) -> str:
    med = _rows(results)
    meta = results["meta"]
    lines = [f"Machine: {meta['cpus']} cores for {max(n for _, n, _ in med)} peers (peer i on core "
             f"i mod {meta['cpus']}: at 3 peers two share a core); 1-minute load average "
             f"{meta['load_start'][0]:.1f} at the start, {meta.get('load_end', [float('nan')])[0]:.1f} "
             f"at the end (the machine is shared with other work: absolute times are inflated). "
             f"Medians over {meta['rounds']} round(s), the order of star and ring alternating. "
             "Overhead = step minus the slowest peer's compute; a ring hop = the ring's overhead / "
             "2 (n - 1) (its chunk messages one after another).", "",
             "| run | peers | aggregate | steps/s | step ms | vs the star, same peers | slowest compute ms "
             "| overhead ms | per ring hop ms | messages out / in per step (host first) "
             "| bytes out per step (host first) | load | same hash as 1 peer |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (run, n, agg), m in sorted(med.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "star")):
        star = med.get((run, n, "star"))
        base = med.get((run, 1, "star"))
        hop = f"{m['over'] / (2 * (n - 1)) * 1e3:.2f}" if agg == "ring" and n > 1 else ""
        same = base is not None and m["hashes"] == base["hashes"] and len(m["hashes"]) == 1 and m["agree"]
        lines.append(
            f"| {run} | {n} | {agg} | {1 / m['step']:.1f} | {m['step'] * 1e3:.2f} | "
            f"{star['step'] / m['step']:.2f}x | {m['compute'] * 1e3:.2f} | {m['over'] * 1e3:.2f} | {hop} | "
            + ", ".join(f"{o:.1f} / {i:.1f}" for o, i in m["msgs"]) + " | "
            + ", ".join(f"{b / 1e3:.1f} kB" for b in m["bytes"])
            + f" | {m['load']:.1f} | {'yes' if same else 'NO'} |")
    return "\n\n".join(["\n".join(lines), *extrapolate(med, meta)])
