"""Local steps at 4-16 devices, star and ring: a model fed by bench/local_steps.py's measured
rooms and by exact curves (issue 22, item 3: "extend the 4-16 device extrapolation with
local steps and the ring").

One replica per device (R = n): the rounds to target at R = n come from the single-process
reference (exact, like every curve of bench/local_steps.py); a round's time is the model of
daisychain/peer/run/ring.py (the one ``--aggregate auto`` uses) with a local round's costs:

* c = one replica's round of compute = the 1-peer round time of the measured R=2 run / 2;
* V = the bytes one member sends per round = the 2-peer room's wire bytes per round / 2;
* star T(n) = c + 2h + (n - 1)(s + 2 V b), with h fitted to the measured 2-peer round
  (h = (T(2) - c - s - 2 V b) / 2) and s, b ring.py's defaults;
* ring T(n) = c + (2n - 1) h_r + 2 (n - 1) b V / n, h_r fitted to the measured 2-peer ring
  round where ``--aggregate star,ring`` timed one (h_r = (T_ring(2) - c - b V) / 3), else
  ring.py's ring hop.

A local-steps room sums its rounds between anchors by the ring where ``--aggregate auto``'s
model says so (anchor rounds, whose inner moments the coordinator checks, by the star); the
"faster" column is that choice with these fitted costs.
"""

from __future__ import annotations

import math

from daisychain.peer.run.ring import LINK_B_S_PER_BYTE, MEMBER_S, RING_HOP_S


def star_s(n: int, c: float, v: float, h: float) -> float:
    return c + 2 * h + (n - 1) * (MEMBER_S + 2 * v * LINK_B_S_PER_BYTE)


def ring_s(n: int, c: float, v: float, h: float = RING_HOP_S) -> float:
    return c + (2 * n - 1) * h + 2 * (n - 1) * LINK_B_S_PER_BYTE * v / n


def costs(res: dict) -> list[dict]:
    """Per measured local run (R=2, timed at 1 and 2 peers): c, V, the fitted star hop."""
    times = {(r["run"], r["n"]): r for r in res.get("rooms", []) if r.get("aggregate", "star") == "star"}
    rings = {r["run"]: r for r in res.get("rooms", []) if r.get("aggregate") == "ring" and r["n"] == 2}
    out = []
    for c in res["curves"]:
        one, two = times.get((c["run"], 1)), times.get((c["run"], 2))
        if not c["local"] or one is None or two is None:
            continue
        r = c["samples_per_round"] // (c["batch"] * int(c["args"][c["args"].index("--sync-every") + 1]))
        comp = one["round_s"] / r
        v = two["bytes_per_round"] / 2
        h = max(0.0, (two["round_s"] - math.ceil(r / 2) * comp - MEMBER_S - 2 * v * LINK_B_S_PER_BYTE) / 2)
        k = {"run": c["run"], "batch": c["batch"], "args": c["args"], "c": comp, "v": v, "h": h,
             "round2_s": two["round_s"], "h_r": RING_HOP_S}
        ring = rings.get(c["run"])
        if ring is not None:  # a measured 2-peer ring round: T = ceil(R/2) c + 3 h_r + b V
            vr = ring["bytes_per_round"] / 2
            k["h_r"] = max(0.0, (ring["round_s"] - math.ceil(r / 2) * comp - LINK_B_S_PER_BYTE * vr) / 3)
            k["ring2_s"] = ring["round_s"]
        out.append(k)
    return out


def add_curves(res: dict, rs, ns: list[int], max_samples: int, val: int) -> None:
    """The rounds to target of each measured local run at R = n (exact, this process)."""
    from tqdm import tqdm

    from bench.local_steps import Run, curve

    todo = [(k, n) for k in costs(res) for n in ns]
    res["extrapolation"] = res.get("extrapolation", {})
    for k, n in tqdm(todo, desc="curves at R = n", unit="run"):
        h = int(k["args"][k["args"].index("--sync-every") + 1])
        name = f"R={n} H={h}, batch {k['batch']}"
        if name in res["extrapolation"]:
            continue
        c = curve(rs, Run(name, k["batch"], n, h), res["target"], max_samples, val)
        res["extrapolation"][name] = {"from": k["run"], "n": n, "rounds": c["rounds_to_target"],
                                      "samples_per_round": k["batch"] * n * h}


def report(res: dict, best_s: float | None) -> str:
    """Markdown: per run and n, rounds to target at R = n, the star's and the ring's round
    time, time to target and its speed against the best single device."""
    lines = ["| run | devices n | rounds to target (R = n) | samples to target | star round ms | ring round ms "
             "| faster | time to target s (faster) | vs best single device |", "|---|---|---|---|---|---|---|---|---|"]
    fits = {k["run"]: k for k in costs(res)}
    for name, e in res.get("extrapolation", {}).items():
        k = fits.get(e["from"])
        if k is None:
            continue
        n = e["n"]
        st, rg = star_s(n, k["c"], k["v"], k["h"]), ring_s(n, k["c"], k["v"], k["h_r"])
        best = min(st, rg)
        t = e["rounds"] * best if e["rounds"] else math.inf
        reached = (f"{e['rounds']} | {e['rounds'] * e['samples_per_round']:,}" if e["rounds"]
                   else "not reached | -")
        speed = f"{best_s / t:.2f}x" if best_s and e["rounds"] else "-"
        lines.append(f"| {name} | {n} | {reached} | {st * 1e3:.1f} | {rg * 1e3:.1f} | "
                     f"{'star' if st <= rg else 'ring'} | {t:.2f} | {speed} |")
    params = "; ".join(f"{k['run']}: c = {k['c'] * 1e3:.1f} ms, V = {k['v'] / 1e3:.1f} kB, star hop h = "
                       f"{k['h'] * 1e3:.1f} ms (fitted to its 2-peer round, {k['round2_s'] * 1e3:.1f} ms)" +
                       (f", ring hop h_r = {k['h_r'] * 1e3:.1f} ms (fitted to its 2-peer ring round, "
                        f"{k['ring2_s'] * 1e3:.1f} ms)" if "ring2_s" in k else "")
                       for k in fits.values())
    lines += ["", f"Costs: {params}; s = {MEMBER_S * 1e3:.1f} ms, b = {LINK_B_S_PER_BYTE * 1e9:.0f} ns/B, "
              f"ring hop h_r = {RING_HOP_S * 1e3:.1f} ms where no ring round was measured "
              f"(daisychain/peer/run/ring.py's defaults)."]
    return "\n".join(lines)


def settings_for(meta: dict, data):
    """The run settings bench/local_steps.py used (its meta), for the extra curves."""
    import argparse

    from bench.local_steps import task_args
    from daisychain.engine.settings import add_run_arguments, settings_from_args

    rp = argparse.ArgumentParser()
    add_run_arguments(rp)
    return settings_from_args(rp.parse_args([*task_args(meta.get("task", "text"), data), "--batch", "64"]))
