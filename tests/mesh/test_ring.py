"""Mesh tier, ring rooms: real ``daisy-peer`` processes summing each step by a ring
(reduce-scatter + all-gather over their own aiortc data channels, daisychain/peer/run/ring.py)
end on ``daisychain train``'s hash, also when a member is killed mid-run. Run inside the
private network namespace:

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_ring.py -q
"""

from __future__ import annotations

from .test_mesh import LONG, host, peers, reference, server  # noqa: F401  (fixtures)

RING = ("--verify-rate", "0", "--aggregate", "ring")


def reference_of(*argv: str) -> str:
    import argparse

    from daisychain.engine.cli import train
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return train(settings_from_args(p.parse_args(list(argv))), quiet=True)["params_sha256"]


def test_three_peers_by_ring_train_to_the_reference_hash(server, peers):  # noqa: F811
    h, code = host(peers, server, 20, 2, *RING)
    members = [peers(server, "--room", code, name=f"m{i}") for i in (1, 2)]
    ref = reference(20)
    assert h.hash() == ref
    for m in members:
        assert m.hash() == ref
    err = h.stderr()
    assert "aggregating by ring: 3 devices, no spot-checks" in err


def test_auto_picks_the_ring_without_spot_checks_and_the_star_with_them(server, peers):  # noqa: F811
    """auto: the ring for a model whose step is bytes (256,256: 200 k parameters), nothing
    checked; the star when spot-checks are on."""
    big = ("--layers", "256,256")
    h, code = host(peers, server, 10, 1, "--verify-rate", "0", *big)
    m = peers(server, "--room", code, name="m1")
    assert h.hash() == m.hash() == reference_of("--steps", "10", *big)
    assert "aggregating by ring: 2 devices, no spot-checks; the cost model" in h.stderr()
    h2, code2 = host(peers, server, 10, 1)
    m2 = peers(server, "--room", code2, name="m2")
    assert h2.hash() == m2.hash() == reference(10)
    assert "aggregating by star: 2 devices, spot-checks at rate 0.05" in h2.stderr()


def test_killed_member_mid_ring_keeps_the_hash(server, peers):  # noqa: F811
    h, code = host(peers, server, LONG, 2, *RING)
    m1 = peers(server, "--room", code, name="m1")
    m2 = peers(server, "--room", code, name="m2")
    m2.wait_for("joined run")
    h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")  # steps are being committed
    m2.kill()
    ref = reference(LONG)
    assert h.hash() == ref
    assert m1.hash() == ref
    err = h.stderr()
    assert "left during step" in err and "its ring is abandoned" in err
    assert "aggregating by ring: 2 devices" in err


def test_a_local_steps_room_sums_by_the_ring_between_anchors(server, peers):  # noqa: F811
    """--aggregate ring on a local-steps run (4 replicas, 2 inner steps a round, an anchor
    every 2nd round) over real data channels: rounds between anchors by the ring, anchor
    rounds by the star (docs/MESH.md "The ring"); the room ends on train's hash."""
    run = ("--task", "text", "--hidden", "16", "--embed-dim", "4", "--context", "4", "--batch", "16",
           "--micro-batch", "4", "--replicas", "4", "--sync-every", "2", "--moments-every", "2")
    h, code = host(peers, server, 5, 1, *RING, *run)
    m = peers(server, "--room", code, name="m1")
    assert h.hash() == m.hash() == reference_of("--steps", "5", *run)
    assert "aggregating by ring: 2 devices, no spot-checks (--aggregate ring); anchor rounds by the star" \
        in h.stderr()