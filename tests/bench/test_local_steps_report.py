"""bench/local_steps.py's arithmetic: time to target = rounds to target x measured seconds per
round, against the best single device (the fastest synchronous run on one peer)."""

from bench.local_steps import time_to_target


def _curve(run, local, rounds, per_round):
    return {"run": run, "local": local, "rounds_to_target": rounds, "samples_per_round": per_round,
            "points": [(0, 0, 4.0), (rounds or 10, (rounds or 10) * per_round, 2.0)]}


def _room(run, n, round_s):
    return {"run": run, "n": n, "round_s": round_s, "bytes_per_round": 1000.0, "hashes_agree": True}


def test_time_to_target_and_the_best_single_device():
    res = {"curves": [_curve("sync 16", False, 1000, 16), _curve("sync 64", False, 400, 64),
                      _curve("R=2 H=32", True, 20, 2048), _curve("R=2 H=8", True, None, 512)],
           "rooms": [_room("sync 16", 1, 0.002), _room("sync 64", 1, 0.004), _room("sync 64", 2, 0.010),
                     _room("R=2 H=32", 1, 0.2), _room("R=2 H=32", 2, 0.05), _room("R=2 H=8", 2, 0.01)]}
    rows, best = time_to_target(res)
    assert best["run"] == "sync 64" and best["n"] == 1 and abs(best["time_s"] - 1.6) < 1e-12
    by = {(r["run"], r["n"]): r for r in rows}
    assert abs(by[("sync 16", 1)]["time_s"] - 2.0) < 1e-12 and abs(by[("sync 16", 1)]["speed"] - 0.8) < 1e-12
    assert abs(by[("R=2 H=32", 2)]["time_s"] - 1.0) < 1e-12 and abs(by[("R=2 H=32", 2)]["speed"] - 1.6) < 1e-12
    assert by[("R=2 H=8", 2)]["rounds"] is None and by[("R=2 H=8", 2)]["speed"] == 0.0
    assert ("R=2 H=8", 1) not in by  # no room measured: no row


def test_no_single_device_reached_the_target():
    res = {"curves": [_curve("sync 16", False, None, 16)], "rooms": [_room("sync 16", 1, 0.002)]}
    rows, best = time_to_target(res)
    assert best is None and rows[0]["speed"] == 0.0


def test_the_local_extrapolation_fits_the_measured_two_peer_round():
    """bench/local_extrapolate.py: c = the 1-peer round / R, V = the 2-peer bytes / 2, and the
    star's hop fitted so the model gives back the measured 2-peer round; the ring's round
    grows by hops and V / n chunks."""
    from bench.local_extrapolate import costs, ring_s, star_s

    c = {**_curve("R=2 H=32", True, 20, 2048), "batch": 32, "args": ["--batch", "32", "--replicas", "2",
                                                                      "--sync-every", "32"]}
    res = {"curves": [c], "rooms": [{**_room("R=2 H=32", 1, 0.2)}, {**_room("R=2 H=32", 2, 0.15),
                                                                     "bytes_per_round": 200_000.0}]}
    (k,) = costs(res)
    assert abs(k["c"] - 0.1) < 1e-12 and k["v"] == 100_000.0
    assert abs(star_s(2, k["c"], k["v"], k["h"]) - 0.15) < 1e-12
    assert star_s(4, k["c"], k["v"], k["h"]) > star_s(2, k["c"], k["v"], k["h"])
    assert ring_s(4, k["c"], k["v"], 0.005) - ring_s(2, k["c"], k["v"], 0.005) > 2 * 0.005


def test_a_measured_ring_room_is_its_own_row_and_fits_the_ring_hop():
    """--aggregate star,ring: the 2-peer ring room is a row of its own (summed by ring), the
    star's fit ignores it, and the ring's hop is fitted so the model gives back its round."""
    from bench.local_extrapolate import costs, ring_s, star_s

    c = {**_curve("R=2 H=32", True, 20, 2048), "batch": 32, "args": ["--batch", "32", "--replicas", "2",
                                                                      "--sync-every", "32"]}
    res = {"curves": [c, _curve("sync 64", False, 400, 64)],
           "rooms": [_room("sync 64", 1, 0.004), _room("R=2 H=32", 1, 0.2),
                     {**_room("R=2 H=32", 2, 0.15), "aggregate": "star", "bytes_per_round": 200_000.0},
                     {**_room("R=2 H=32", 2, 0.12), "aggregate": "ring", "bytes_per_round": 200_000.0}]}
    rows, best = time_to_target(res)
    by = {(r["run"], r["n"], r["aggregate"]): r for r in rows}
    assert abs(by[("R=2 H=32", 2, "ring")]["time_s"] - 2.4) < 1e-12
    assert abs(by[("R=2 H=32", 2, "star")]["time_s"] - 3.0) < 1e-12
    (k,) = costs(res)
    assert abs(star_s(2, k["c"], k["v"], k["h"]) - 0.15) < 1e-12
    assert abs(ring_s(2, k["c"], k["v"], k["h_r"]) - 0.12) < 1e-12 and k["ring2_s"] == 0.12
