"""Time to a target validation loss: synchronous steps against exact local steps
(``--replicas R --sync-every H``), on 1 and 2 ``daisy-peer`` processes over 1 ms of delay
each way (issue 22, item 3).

A room ends on the bits of the single-process reference whatever its devices, so a run's
validation-loss curve *per round* is the reference's, exactly; only the time per round
depends on the room. The bench therefore measures the two separately and multiplies:

1. **Curves** (this process, the engine itself): validation loss (the test split's mean
   cross-entropy on the first ``--val`` windows) every round of every run until it reaches
   the target, or ``--max-samples``. The target is the loss the synchronous run at the
   default batch reaches after ``--target-steps`` steps (``daisychain train``'s default
   length), the same for every row.
2. **Round times** (real rooms, bench/scaling.py's harness: each peer its own process,
   network namespace and core, 1 ms each way added in user space): seconds per committed
   step (a round, for local steps) at 1 and 2 peers, wire bytes per round.
3. Time to target = rounds to target x seconds per round; the baseline is one device
   running the synchronous run at its best batch size (of ``--batches``).

    sudo .venv/bin/python -m bench.local_steps [--task text] [--data FILE] [--quick]

Writes docs/BENCHMARKS.md (the section between ``<!-- bench:local-steps -->`` markers) and
docs/local_steps.png (validation loss against wall time). Needs root (namespaces) for part 2;
``--curves-only`` runs part 1 alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LICENCES = ("GPL-3", "LGPL-2.1", "MPL-1.1")


def default_text() -> Path:
    """A local English text of ~87 kB (three licence texts every Debian system has), or the
    repository's docs where they are missing."""
    out = Path(tempfile.gettempdir()) / "daisychain-bench-text.txt"
    base = Path("/usr/share/common-licenses")
    parts = [base / n for n in LICENCES] if all((base / n).is_file() for n in LICENCES) else \
        sorted((ROOT / "docs").glob("*.md"))
    out.write_text("".join(p.read_text(encoding="utf-8", errors="replace") for p in parts), encoding="utf-8")
    return out


def task_args(task: str, data: Path | None) -> list[str]:
    return ["--task", task, *(["--data", str(data)] if data else [])]


def val_loss(tr, limit: int) -> float:
    """Mean cross-entropy over the first ``limit`` test samples (display arithmetic: numpy
    log; it never feeds the parameters)."""
    ds, eng, mb = tr.ds, tr.engine, tr.hp.micro_batch
    total, n = 0.0, 0
    for i in range(0, min(limit, len(ds.y_test)), mb):
        x, y = ds.x_test[i:min(i + mb, limit)], ds.y_test[i:min(i + mb, limit)]
        z, _ = eng.forward(tr.theta, x[None])
        p = eng.softmax(z)[0]
        total += float(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)).sum())
        n += len(y)
    return total / max(n, 1)


@dataclasses.dataclass
class Run:
    name: str
    batch: int
    replicas: int = 1
    sync_every: int = 1

    @property
    def local(self) -> bool:
        return self.replicas > 1 or self.sync_every > 1

    def args(self) -> list[str]:
        out = ["--batch", str(self.batch)]
        if self.local:
            out += ["--replicas", str(self.replicas), "--sync-every", str(self.sync_every)]
        return out

    def samples_per_round(self) -> int:
        return self.batch * self.replicas * self.sync_every


def curve(rs, run: Run, target: float | None, max_samples: int, val: int, every: int = 1) -> dict:
    """Validation loss after every ``every``-th round until ``target`` (or max_samples)."""
    from daisychain.engine.local import make_trainer
    from daisychain.units import load_luts

    hp = dataclasses.replace(rs.hp, batch=run.batch, replicas=run.replicas, sync_every=run.sync_every)
    tr = make_trainer(rs.spec, hp, rs.ds, load_luts())
    tasks = list(range(tr.n_tasks))
    points, rounds, reached = [(0, 0, val_loss(tr, val))], 0, None
    max_rounds = max(1, max_samples // run.samples_per_round())
    t0 = time.perf_counter()
    while rounds < max_rounds:
        tr.apply(tr.contribute(tasks).grad)
        rounds += 1
        if rounds % every == 0 or rounds == max_rounds:
            loss = val_loss(tr, val)
            points.append((rounds, rounds * run.samples_per_round(), loss))
            if target is not None and loss <= target:
                reached = rounds
                break
    return {"run": run.name, "points": points, "rounds_to_target": reached,
            "cpu_s": time.perf_counter() - t0, "hash": tr.params_sha256()}


def plan(local_batches: list[int], batches: list[int], sync_every: list[int], replicas: int) -> list[Run]:
    runs = [Run(f"sync, batch {b}", b) for b in batches]
    runs += [Run(f"R={replicas} H={h}, batch {b}", b, replicas, h) for b in local_batches
             for h in sync_every if h > 1]
    return runs


def curves(args, rs) -> dict:
    from tqdm import tqdm

    batches = [int(b) for b in args.batches.split(",")]
    local_batches = [int(b) for b in args.local_batches.split(",")]
    hs = [int(h) for h in args.sync_every.split(",")]
    base = Run(f"sync, batch {rs.hp.batch}", rs.hp.batch)
    target_curve = curve(rs, base, None, args.target_steps * base.batch, args.val, every=args.target_steps)
    target = target_curve["points"][-1][2]
    out = {"target": target, "target_run": base.name, "target_steps": args.target_steps, "curves": []}
    for run in tqdm(plan(local_batches, batches, hs, args.replicas), desc="curves", unit="run"):
        every = 1 if run.local else max(1, 512 // run.batch)  # sync: every 512 samples
        extra = ["--outer-lr", str(rs.hp.outer_lr), "--outer-momentum", str(rs.hp.outer_momentum)] \
            if run.local and args.outer else []
        out["curves"].append({**curve(rs, run, target, args.max_samples, args.val, every),
                              "args": run.args() + extra, "local": run.local, "batch": run.batch,
                              "samples_per_round": run.samples_per_round()})
    return out


def round_times(args, data: Path, res: dict) -> list[dict]:
    """Real rooms of 1 and 2 daisy-peers (bench/scaling.py's harness), 1 ms each way."""
    from bench.scaling import run_mesh, setup_bridge

    setup_bridge()
    tmp = Path(tempfile.mkdtemp(prefix="dc-local-steps-"))
    rows = []
    best_sync = min((c for c in res["curves"] if not c["local"] and c["rounds_to_target"]),
                    key=lambda c: c["rounds_to_target"] * c["samples_per_round"], default=None)
    aggregates = args.aggregate.split(",")
    rooms = []  # (curve, peers, aggregation, rounds): every room of one pass
    for c in res["curves"]:
        peers = (1, 2) if c["local"] or c is best_sync or c["batch"] == args.batch else (1,)
        rounds = max(4, math.ceil(args.room_samples / c["samples_per_round"]))
        if not c["local"]:  # a synchronous step is the same every step: a few hundred tell it
            rounds = min(rounds, args.sync_rounds)
        for n in peers:
            # 2 local-steps peers: one room per aggregation (the star, and the ring of rounds
            # between anchors); synchronous rooms and 1 peer: the star
            rooms += [(c, n, agg, rounds) for agg in (aggregates if n > 1 and c["local"] else ["star"])]
    # --repeat N: N passes over every room, interleaved (a slow minute of the machine lands on
    # one room of each pass, not on every repeat of one room); the median round time is kept
    got: dict[int, list[dict]] = {i: [] for i in range(len(rooms))}
    for rep in range(args.repeat):
        for i, (c, n, agg, rounds) in enumerate(rooms):
            tag = f"{c['run'].replace(' ', '').replace(',', '_').replace('=', '')}-{n}-{agg}-{rep}"
            print(f"[local_steps] {tag}: {rounds} rounds", file=sys.stderr, flush=True)
            r = run_mesh(tmp, n, [*task_args(args.task, data), *c["args"], "--steps", str(rounds)], "",
                         args.delay_ms, tag, aggregate=agg)
            got[i].append({**r, "load": os.getloadavg()[0]})
    for i, (c, n, agg, rounds) in enumerate(rooms):
        rs = got[i]
        times = sorted(r["step_s"] for r in rs)
        rows.append({"run": c["run"], "n": n, "aggregate": agg, "round_s": float(np.median(times)),
                     "round_s_all": times, "bytes_per_round": rs[0]["bytes_per_step"],
                     "hashes_agree": all(r["hashes_agree"] for r in rs) and len({r["hash"] for r in rs}) == 1,
                     "hash": rs[0]["hash"], "load": max(r["load"] for r in rs)})
    return rows


def time_to_target(res: dict) -> tuple[list[dict], dict | None]:
    """Every (run, peers) with a measured round time: rounds to target (from the curves) x
    seconds per round, and its speed against the best single device: the synchronous run
    (any batch) with the shortest time to target on 1 peer. Returns (rows, best row)."""
    curves = {c["run"]: c for c in res["curves"]}
    rows = []
    for t in sorted(res.get("rooms", []), key=lambda t: ([c["run"] for c in res["curves"]].index(t["run"]),
                                                         t["n"], t.get("aggregate", "star") != "star")):
        c, n = curves.get(t["run"]), t["n"]
        if c is not None:
            k = c["rounds_to_target"]
            rows.append({"run": c["run"], "n": n, "aggregate": t.get("aggregate", "star"),
                         "local": c["local"], "rounds": k,
                         "samples_per_round": c["samples_per_round"], "last_samples": c["points"][-1][1],
                         "round_s": t["round_s"], "all": t.get("round_s_all", [t["round_s"]]),
                         "bytes_per_round": t["bytes_per_round"],
                         "agree": t["hashes_agree"], "time_s": k * t["round_s"] if k else math.inf})
    singles = [r for r in rows if r["n"] == 1 and not r["local"] and r["rounds"]]
    best = min(singles, key=lambda r: r["time_s"]) if singles else None
    for r in rows:
        r["speed"] = best["time_s"] / r["time_s"] if best and r["rounds"] else 0.0
    return rows, best


def report(res: dict) -> str:
    """The markdown section: per run, rounds to target (exact, from the curves), the measured
    round time at 1 and 2 peers, and the time to target against the best single device."""
    rows, best = time_to_target(res)
    m = res["meta"]
    lines = [f"Task: {m.get('task', 'text')}, `{m['data_name']}` ({m['data_bytes']:,} bytes, sha256 {m['data_sha'][:12]}), "
             f"{m['model']} ({m['params']:,} parameters). "
             + (f"Outer step of the local-steps runs: lr {m['outer'][0]:g}, momentum {m['outer'][1]:g}. " if m.get("outer") else "")
             + f"Target: validation loss {res['target']:.4f}, "
             f"what `{res['target_run']}` reaches after {res['target_steps']} steps. Validation loss = mean "
             f"cross-entropy over the first {m['val']} test samples. Machine: {m['cpus']} cores, 1-minute "
             f"load average {m['load_start']:.1f} at the start, {m.get('load_end', float('nan')):.1f} at the end.", "",
             "Rounds to target come from the single-process reference: every room ends each round on the "
             "reference's bits, so its loss curve per round is the same. Round time is measured in real "
             f"rooms of daisy-peers (own process, namespace and core each; {m['delay_ms']:g} ms each way "
             "added in user space; `--verify-rate 0`)" + (f"; every room {m['repeat']} times (passes interleaved), "
             "the median round time used, the range in brackets" if m.get("repeat", 1) > 1 else "") +
             ". Time to target = rounds x round time.", "",
             "| run | samples per round | rounds to target | samples to target | peers | summed by | round ms "
             "| wire bytes per round | time to target s | vs best single device | replicas agree |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reached = (f"{r['rounds']} | {r['rounds'] * r['samples_per_round']:,}" if r["rounds"]
                   else f"not reached | (> {r['last_samples']:,})")
        agg = r["aggregate"] if r["n"] > 1 else "-"
        spread = f" ({r['all'][0] * 1e3:.0f}-{r['all'][-1] * 1e3:.0f})" if len(r["all"]) > 1 else ""
        lines.append(f"| {r['run']} | {r['samples_per_round']:,} | {reached} | {r['n']} | {agg} | "
                     f"{r['round_s'] * 1e3:.1f}{spread} | "
                     f"{r['bytes_per_round']:,.0f} | {r['time_s']:.2f} | {r['speed']:.2f}x | "
                     f"{'yes' if r['agree'] else 'NO'} |")
    lines += ["", f"Best single device: `{best['run']}` ({best['time_s']:.2f} s to target)." if best else
              "No single-device run reached the target.", ""]
    if res.get("extrapolation"):
        from bench.local_extrapolate import report as extrapolation

        lines += ["At 4-16 devices, one replica each (a model, bench/local_extrapolate.py: rounds to target "
                  "exact at R = n, round times from the costs measured above):", "",
                  extrapolation(res, best["time_s"] if best else None), ""]
    lines += [
              f"Command: `{m['command']}`  "] + ([f"Rooms (round times) from: `{m['rooms_from']}`  "]
                                                  if m.get("rooms_from") else []) + [
              f"Plot: docs/{m.get('png') or png_name(m.get('task', 'text'))} (validation loss against the time "
              "each round took in the rooms above)."]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    """Validation loss against wall time (rounds x measured round time), one line per run and
    peer count (matplotlib, the `bench` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {c["run"]: c for c in res["curves"]}
    rooms = res.get("rooms", [])
    # the synchronous rooms, and of each local-steps run its faster 2-peer room (its 1-peer
    # and slower rooms are in the table): a readable plot
    fastest = {}
    for t in rooms:
        if curves.get(t["run"], {}).get("local") and t["n"] > 1:
            if t["run"] not in fastest or t["round_s"] < fastest[t["run"]]["round_s"]:
                fastest[t["run"]] = t
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=100)
    for t in rooms:
        c, n, agg = curves.get(t["run"]), t["n"], t.get("aggregate", "star")
        if c is None or (c["local"] and fastest.get(t["run"]) is not t):
            continue
        pts = [p for p in c["points"] if p[0] > 0]  # log time axis: from the first round on
        xs = [p[0] * t["round_s"] for p in pts]
        ax.plot(xs, [p[2] for p in pts], "-" if c["local"] else "--" if n == 1 else ":",
                label=f"{c['run']}, {n} peer{'s' if n > 1 else ''}" + (f" ({agg})" if c["local"] else ""))
    ax.axhline(res["target"], color="grey", lw=0.8, ls=":", label="target")
    ax.set_xscale("log")
    ax.set_xlabel("wall time (s, log scale): rounds x measured round time")
    ax.set_ylabel("validation loss")
    ax.set_title("Synchronous (dashed: 1 peer, dotted: 2) vs exact local steps (2 peers), 1 ms each way")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def png_name(task: str) -> str:
    return "local_steps.png" if task == "text" else f"local_steps_{task}.png"


def write_section(text: str, task: str = "text", name: str | None = None) -> None:
    name = name or ("local-steps" if task == "text" else f"local-steps-{task}")
    doc = ROOT / "docs" / "BENCHMARKS.md"
    src = doc.read_text()
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{text}\n{end}"
    if start in src:
        src = src[:src.index(start)] + block + src[src.index(end) + len(end):]
    else:
        src = src.rstrip("\n") + (f"\n\n## Local steps: time to a target loss, {task} task (bench/local_steps.py)"
                                   f"\n\n{block}\n")
    doc.write_text(src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="text", choices=("text", "image"),
                    help="text: the char model on a local text file; image: the default CNN on the embedded MNIST")
    ap.add_argument("--data", default=None, help="text file (default: three licence texts, ~87 kB)")
    ap.add_argument("--batch", type=int, default=64, help="batch of the target run (synchronous)")
    ap.add_argument("--local-batches", default="32", help="batches (per replica and inner step) of the local-steps runs")
    ap.add_argument("--batches", default="16,32,64,128", help="synchronous batches (the single-device baseline)")
    ap.add_argument("--sync-every", default="8,32,128", help="H of the local-steps runs")
    ap.add_argument("--replicas", type=int, default=2, help="R of the local-steps runs (one per peer at 2 peers)")
    ap.add_argument("--target-steps", type=int, default=600)
    ap.add_argument("--max-samples", type=int, default=400_000)
    ap.add_argument("--val", type=int, default=2048, help="validation windows")
    ap.add_argument("--room-samples", type=int, default=40_000, help="samples each room trains (>= 4 rounds)")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--sync-rounds", type=int, default=600, help="at most this many steps in a synchronous room")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure every room this many times, interleaved; the median round time is used")
    ap.add_argument("--aggregate", default="star", metavar="star,ring",
                    help="how 2-peer local-steps rooms sum their rounds: one room each (default star)")
    ap.add_argument("--curves-only", action="store_true", help="part 1 only (no root needed); no docs")
    ap.add_argument("--curves", default=None, metavar="FILE",
                    help="take part 1 from an earlier --out file (the curves do not depend on the room)")
    ap.add_argument("--outer", default=None, metavar="LR,MOMENTUM",
                    help="the local-steps runs' outer step (default: the run's defaults); round times do "
                         "not depend on it (--rooms-from)")
    ap.add_argument("--rooms-from", default=None, metavar="FILE",
                    help="take part 2 (the rooms) from an earlier --out file: round times do not depend "
                         "on the target, so another --target-steps needs no new rooms")
    ap.add_argument("--section", default=None,
                    help="the BENCHMARKS.md section to write (default: local-steps, or local-steps-<task>)")
    ap.add_argument("--out", default=None, help="also write the raw results (JSON) here")
    ap.add_argument("--report", default=None, help="only rewrite the report and plot from an --out file")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--extrapolate", default="4,8,16", help="device counts of the local-steps model ('' for none)")
    args = ap.parse_args()
    ns = [int(n) for n in args.extrapolate.split(",") if n]
    if args.report:
        res = json.loads(Path(args.report).read_text())
        if ns and "extrapolation" not in res:  # an older --out file: its extra curves now
            from bench.local_extrapolate import add_curves, settings_for

            task = res["meta"].get("task", "text")
            data = Path(args.data) if args.data else (default_text() if task == "text" else None)
            add_curves(res, settings_for(res["meta"], data), ns, args.max_samples, args.val)
    else:
        if not args.curves_only and not args.rooms_from and not os.environ.get("DAISY_SCALING_NS"):
            os.execvp("unshare", ["unshare", "-n", "--", "env", "DAISY_SCALING_NS=1", sys.executable,
                                  "-m", "bench.local_steps", *sys.argv[1:]])
        from daisychain.engine.settings import add_run_arguments, settings_from_args

        data = Path(args.data) if args.data else (default_text() if args.task == "text" else None)
        rp = argparse.ArgumentParser()
        add_run_arguments(rp)
        outer = ["--outer-lr", args.outer.split(",")[0], "--outer-momentum", args.outer.split(",")[1]] \
            if args.outer else []
        rs = settings_from_args(rp.parse_args([*task_args(args.task, data), "--batch", str(args.batch), *outer]))
        raw = data.read_bytes() if data else (ROOT / "daisychain" / "data" / "mnist.npz").read_bytes()
        res = json.loads(Path(args.curves).read_text()) if args.curves else curves(args, rs)
        res["meta"] = {"task": args.task, "data_name": args.data or (
                           "GPL-3 + LGPL-2.1 + MPL-1.1 (/usr/share/common-licenses)" if args.task == "text"
                           else "the embedded MNIST (8,000 / 2,000)"),
                       "data_bytes": len(raw), "data_sha": hashlib.sha256(raw).hexdigest(),
                       "model": " ".join(l.type for l in rs.spec.layers if l.type != "relu"),
                       "params": sum(int(np.prod(s)) for _, s in rs.spec.param_shapes()), "val": args.val, "cpus": os.cpu_count(), "load_start": os.getloadavg()[0],
                       "delay_ms": args.delay_ms, "repeat": args.repeat,
                       "outer": [rs.hp.outer_lr, rs.hp.outer_momentum],
                       "command": "sudo .venv/bin/python -m bench.local_steps " + " ".join(sys.argv[1:])}
        for c in res["curves"]:
            print(f"{c['run']}: rounds to target {c['rounds_to_target']} ({c['cpu_s']:.1f} s)", file=sys.stderr)
        if args.curves_only:
            print(json.dumps({k: v for k, v in res.items() if k != "curves"}, indent=1))
            if args.out:
                Path(args.out).write_text(json.dumps(res))
            return
        if args.rooms_from:
            earlier = json.loads(Path(args.rooms_from).read_text())
            runs = {c["run"] for c in res["curves"]}
            res["rooms"] = [t for t in earlier["rooms"] if t["run"] in runs]
            res["meta"]["rooms_from"] = earlier["meta"]["command"]
            res["meta"]["repeat"] = earlier["meta"].get("repeat", 1)
            res["meta"]["load_start"] = earlier["meta"]["load_start"]
        else:
            res["rooms"] = round_times(args, data, res)
        res["meta"]["load_end"] = os.getloadavg()[0]
        if ns:
            from bench.local_extrapolate import add_curves

            add_curves(res, rs, ns, args.max_samples, args.val)
    if args.section and not args.report:
        res["meta"]["png"] = args.section.replace("-", "_") + ".png"
    if args.out:
        Path(args.out).write_text(json.dumps(res))
    text = report(res)
    print(text)
    if not args.no_write:
        write_section(text, res["meta"].get("task", "text"), args.section)
        plot(res, ROOT / "docs" / (res["meta"].get("png") or png_name(res["meta"].get("task", "text"))))


if __name__ == "__main__":
    main()
