"""The image recipe (daisychain/engine/augment.py): the shift augmentation is a pure function
of (seed, step, batch slot), identical in Python and JS (tests/data/augment_cases.json, which
both read), and the learning-rate schedule uses + - * / only. Unit tier, plus one run of
``daisychain train --task image`` split over simulated peers.

Regenerate the shared cases (only when the algorithm changes on purpose):
``python tests/engine/test_image_recipe.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from daisychain.engine import augment  # noqa: E402
from daisychain.engine.augment import lr_at, shift_images, shifts, step_inputs  # noqa: E402
from daisychain.engine.spec import Hyper, SpecError  # noqa: E402
from jsrun import run_js  # noqa: E402

CASES = ROOT / "tests" / "data" / "augment_cases.json"


def make_cases() -> dict:
    draws = []
    for seed, step, shift in [(0, 0, 2), (7, 1, 2), (4294967295, 123456, 2), (5, 99, 1), (3, 2, 8)]:
        slots = list(range(0, 40, 3)) + [255]
        dx, dy = shifts(seed, step, np.array(slots), shift)
        draws.append({"seed": seed, "step": step, "shift": shift, "slots": slots,
                      "dx": dx.tolist(), "dy": dy.tolist()})
    rng = np.random.default_rng(11)
    images = []
    for shape, dx, dy in [((1, 5, 5), 2, -1), ((3, 4, 4), -1, 2), ((1, 6, 3), 0, 0), ((2, 3, 5), -2, -2)]:
        img = rng.integers(1, 256, int(np.prod(shape)), dtype=np.uint8)
        out = shift_images(img[None], shape, np.array([dx]), np.array([dy]))[0]
        images.append({"shape": list(shape), "dx": dx, "dy": dy, "in": img.tolist(), "out": out.tolist()})
    hps = [{"lr": 3e-3, "lr_warmup": 100, "lr_decay_steps": 3000},
           {"lr": 1e-2, "lr_warmup": 0, "lr_decay_steps": 7},
           {"lr": 0.001, "lr_warmup": 3, "lr_decay_steps": 0}]
    lrs = []
    for h in hps:
        hp = Hyper(**h)
        ts = [0, 1, 2, 3, 5, 6, 7, 8, 99, 100, 101, 1234, 2999, 3000, 3001]
        lrs.append({"hyper": h, "t": ts, "lr_hex": [float(lr_at(hp, t)).hex() for t in ts]})
    return {"stream_augment": augment.STREAM_AUGMENT, "draws": draws, "images": images, "lr": lrs}


def test_shared_cases_are_current():
    assert json.loads(CASES.read_text()) == make_cases()


def test_shifts_are_a_pure_function_of_seed_step_slot():
    a = shifts(9, 17, np.arange(64), 2)
    # any subset, in any order, draws the same values for its slots
    sub = np.array([63, 5, 17, 0])
    b = shifts(9, 17, sub, 2)
    assert np.array_equal(b[0], a[0][sub]) and np.array_equal(b[1], a[1][sub])
    assert all(((-2 <= v) & (v <= 2)).all() for v in a)
    # every shift occurs; another step, another seed, another stream
    assert set(a[0].tolist()) == {-2, -1, 0, 1, 2} and set(a[1].tolist()) == {-2, -1, 0, 1, 2}
    assert not np.array_equal(shifts(9, 18, np.arange(64), 2)[0], a[0])
    assert not np.array_equal(shifts(10, 17, np.arange(64), 2)[0], a[0])


def test_shift_moves_the_picture_with_zero_fill():
    img = np.zeros((1, 2, 4, 4), np.uint8)
    img[0, 0, 1, 1] = 9  # channel 0, y=1, x=1
    img[0, 1, 3, 3] = 7  # channel 1, corner: shifted out
    out = shift_images(img.reshape(1, -1), (2, 4, 4), np.array([2]), np.array([-1])).reshape(2, 4, 4)
    assert out[0, 0, 3] == 9 and out.sum() == 9  # right by 2, up by 1


def test_the_compiled_shift_gives_the_numpy_definitions_bytes():
    """shift_images' compiled pass (numba) against its numpy definition, byte for byte: every
    shift up to MAX_SHIFT, shifts wider than the picture, several channels, one pixel."""
    assert augment._shift_kernel() is not None
    rng = np.random.default_rng(46)
    for shape, s, m in [((1, 28, 28), 2, 64), ((3, 32, 32), 8, 40), ((2, 5, 7), 8, 50), ((1, 1, 1), 3, 20),
                        ((4, 3, 9), 5, 30)]:
        x = rng.integers(0, 256, (m, int(np.prod(shape))), dtype=np.uint8)
        dx, dy = rng.integers(-s, s + 1, m), rng.integers(-s, s + 1, m)
        got = shift_images(x, shape, dx, dy)
        want = augment.shift_images_numpy(x, shape, dx, dy)
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


class _DS:
    def __init__(self, n=40):
        rng = np.random.default_rng(2)
        self.x_train = rng.integers(0, 256, (n, 2 * 6 * 6), dtype=np.uint8)
        self.y_train = (np.arange(n) % 3).astype(np.int32)
        self.image_shape = (2, 6, 6)


def test_step_inputs_of_any_micro_batches_match_the_whole_step():
    from daisychain.engine.trainer import Schedule

    ds, hp = _DS(), Hyper(batch=16, micro_batch=4, seed=3, augment_shift=2)
    sched = Schedule(len(ds.y_train), hp)
    full, y = step_inputs(ds, hp, sched, 5, range(4))
    part, yp = step_inputs(ds, hp, sched, 5, [2, 0])
    assert np.array_equal(part, full[[2, 0]]) and np.array_equal(yp, y[[2, 0]])
    plain, _ = step_inputs(ds, Hyper(batch=16, micro_batch=4, seed=3), sched, 5, range(4))
    assert not np.array_equal(plain, full)
    # the augmented sample is the plain one, shifted by its slot's draw
    dx, dy = shifts(3, 5, np.arange(16), 2)
    want = shift_images(plain.reshape(16, -1), ds.image_shape, dx, dy).reshape(full.shape)
    assert np.array_equal(full, want)


def test_lr_schedule_values_and_settings():
    hp = Hyper(lr=0.01, lr_warmup=4, lr_decay_steps=10)
    assert [lr_at(hp, t) for t in (0, 3)] == [0.01 * (1 / 4), 0.01 * (4 / 4)]
    assert [lr_at(hp, t) for t in (4, 9, 10, 50)] == [0.01, 0.01 * (1 / 6), 0.0, 0.0]
    assert lr_at(Hyper(lr=0.02), 12345) == 0.02
    with pytest.raises(SpecError, match="--lr-warmup"):
        Hyper(lr_warmup=10, lr_decay_steps=10).validate()
    with pytest.raises(SpecError, match="--augment-shift"):
        Hyper(augment_shift=9).validate()


def test_recipe_fields_off_leave_the_identity_json_as_before():
    assert set(Hyper().to_json()) == {"lr", "beta1", "beta2", "eps", "weight_decay", "batch",
                                      "micro_batch", "grad_frac_bits", "seed"}
    hp = Hyper(augment_shift=2, lr_warmup=5, lr_decay_steps=50)
    assert Hyper(**hp.to_json()) == hp and hp.to_json()["augment_shift"] == 2


def test_adam_follows_the_schedule():
    from daisychain.engine.adam import AdamState, adam_step

    g = np.linspace(-1, 1, 7)
    hp = Hyper(lr=0.01, lr_decay_steps=3)
    th, st = np.zeros(7), AdamState.zeros(7)
    for _ in range(4):
        adam_step(th, st, g, hp)
    after3 = th.copy()
    adam_step(th, st, g, hp)  # update index 4 >= 3: lr 0
    assert np.array_equal(th, after3)
    # update 0 at lr * 3/3 is plain Adam's first update
    th2, st2 = np.zeros(7), AdamState.zeros(7)
    adam_step(th2, st2, g, Hyper(lr=0.01))
    th3, st3 = np.zeros(7), AdamState.zeros(7)
    adam_step(th3, st3, g, hp)
    assert np.array_equal(th2, th3)


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_twin_reproduces_the_shared_cases():
    got = run_js("""
const c = JSON.parse(readFileSync(DATA, "utf8"));
const hex = (x) => {  // Python's float.hex for the finite doubles here
  if (x === 0) return "0x0.0p+0";
  const b = new DataView(new ArrayBuffer(8)); b.setFloat64(0, x);
  const hi = b.getUint32(0), lo = b.getUint32(4);
  const e = ((hi >>> 20) & 0x7ff) - 1023;
  const m = (hi & 0xfffff).toString(16).padStart(5, "0") + lo.toString(16).padStart(8, "0");
  return (x < 0 ? "-" : "") + "0x1." + m + "p" + (e >= 0 ? "+" : "") + e;
};
const out = { stream_augment: STREAM_AUGMENT, draws: [], images: [], lr: [] };
for (const d of c.draws) {
  const [dx, dy] = shifts(d.seed, d.step, d.slots, d.shift);
  out.draws.push({ ...d, dx: Array.from(dx), dy: Array.from(dy) });
}
for (const m of c.images) {
  out.images.push({ ...m, out: Array.from(shiftImage(Uint8Array.from(m.in), m.shape, m.dx, m.dy)) });
}
for (const l of c.lr) out.lr.push({ ...l, lr_hex: l.t.map((t) => hex(lrAt(l.hyper, t))) });
console.log(JSON.stringify(out));
""", imports={"{ shifts, shiftImage, lrAt, STREAM_AUGMENT }": "engine/augment.js"}, data=str(CASES))
    assert got == json.loads(CASES.read_text())


def _train(*extra: str) -> dict:
    cmd = [sys.executable, "-m", "daisychain.cli", "train", "--task", "image", "--image-size", "8",
           "--layers", "conv4,pool,16", "--steps", "3", "--batch", "32", "--micro-batch", "8",
           "--json", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_train_image_split_over_random_workers_gives_trains_hash():
    one = _train()
    assert one["identity"]["hyper"]["augment_shift"] == 2
    assert one["identity"]["hyper"]["lr_decay_steps"] == 3
    three = _train("--workers", "3", "--assign", "random")
    assert three["params_sha256"] == one["params_sha256"]
    off = _train("--augment-shift", "0")
    assert off["params_sha256"] != one["params_sha256"] and off["run_id"] != one["run_id"]



SMALL = ["--task", "image", "--image-size", "8", "--layers", "conv4,pool,16", "--steps", "4",
         "--batch", "32", "--micro-batch", "8", "--seed", "3"]


def test_peers_run_protocol_with_augmentation_reaches_trains_hash():
    """Three replicas of daisy-peer's run protocol (sans-IO, run_net.Net): each computes
    its micro-batches through run.contribute_at, which must augment as the trainer does."""
    import argparse

    from daisychain.engine.cli import train
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    from daisychain.peer import run as R
    from run_net import Net

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(SMALL))
    reference = train(rs, quiet=True)["params_sha256"]
    net = Net(rs, 3)
    net.run()
    for pid in net.room():
        ends = net.of(R.Ended, pid)
        assert ends and ends[0].params_sha256 == reference


def test_cluster_image_run_matches_train():
    import os
    import re

    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    outs = []
    for cmd in (["daisychain.cli", "train"], ["daisychain.cluster"]):
        r = subprocess.run([sys.executable, "-m", *cmd, "--quiet", *SMALL], capture_output=True,
                           text=True, timeout=300, env=env, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(re.findall(r"params-sha256: ([0-9a-f]{64})", r.stdout + r.stderr)[-1])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("extra", [[], ["--augment-shift", "0", "--lr-decay-steps", "0", "--lr-warmup", "0"]])
def test_checkpoint_run_flags_remake_the_image_identity(extra):
    """A checkpoint's hint flags must give back the same run, the recipe included (an image
    run made without augmentation must not come back with the default shift)."""
    import argparse
    import shlex

    from daisychain.engine.checkpoint import run_flags
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    from daisychain.engine.trainer import run_identity
    from daisychain.units import load_luts

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args([*SMALL, *extra]))
    ident = run_identity(rs.spec, rs.hp, rs.ds, load_luts())
    flags = shlex.split(run_flags(ident)) + ["--image-size", "8", "--steps", "4"]
    again = settings_from_args(p.parse_args(flags))
    assert run_identity(again.spec, again.hp, again.ds, load_luts()) == ident


if __name__ == "__main__":
    CASES.parent.mkdir(parents=True, exist_ok=True)
    CASES.write_text(json.dumps(make_cases()) + "\n")
    print(f"wrote {CASES}")
