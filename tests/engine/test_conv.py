"""conv2d / maxpool2d / image input in the numpy engine (docs/ENGINE.md, CONV_SPEC): the
literal-table GEMM gives the fast path's bytes on random conv models, any split of a step
gives train's hash, the backward is the gradient of the float twin, the pool's tie rule,
the --layers conv syntax and the spec's refusals."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from daisychain.engine import conv as C
from daisychain.engine.data import model_for
from daisychain.engine.floatref import float_model
from daisychain.engine.golden import image_digits
from daisychain.engine.model import Engine, init_params
from daisychain.engine.settings import add_run_arguments, parse_layers
from daisychain.engine.spec import (Hyper, Layer, ModelSpec, SpecError, cnn, layers_text, mlp)
from daisychain.engine.trainer import Trainer, assign
from daisychain.units import load_luts


@pytest.fixture(scope="module")
def luts():
    return load_luts()


@pytest.fixture(scope="module")
def digits_image():
    return image_digits(1)


def _random_conv_spec(rng) -> ModelSpec:
    """1-2 convs (3x3 or 5x5, 1-6 filters), each maybe pooled, maybe a dense layer, on a
    1-3 channel image of odd and even sizes."""
    items, pools = [], 0
    for _ in range(int(rng.integers(1, 3))):
        items.append(f"conv{int(rng.integers(1, 7))}" + ("k5" if rng.random() < 0.4 else ""))
        if rng.random() < 0.6:
            items.append("pool")
            pools += 1
    if rng.random() < 0.5:
        items.append(int(rng.integers(2, 12)))
    h, w = (int(rng.integers(2 ** pools, 2 ** pools + 6)) for _ in range(2))
    return cnn((int(rng.integers(1, 4)), h, w), items, int(rng.integers(2, 7)))


@pytest.mark.parametrize("seed", range(12))
def test_literal_table_gemm_equals_the_fast_engine_on_random_conv_models(luts, seed):
    rng = np.random.default_rng(seed)
    spec = _random_conv_spec(rng)
    theta = init_params(spec, seed) * rng.choice([1.0, 8.0, 1 / 16])
    n, b = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    x = rng.integers(0, 256, (n, b, spec.input_dim)).astype(np.uint8)
    if rng.random() < 0.3:
        x[0] = 0  # an all-black micro-batch
    y = rng.integers(0, spec.classes, (n, b))
    got = [Engine(spec, luts, gemm).grad(theta, x, y, 40, 2.0**49) for gemm in ("fast", "lut")]
    assert got[0].grad.tobytes() == got[1].grad.tobytes(), spec.to_json()
    assert got[0].loss.tobytes() == got[1].loss.tobytes()
    z = [Engine(spec, luts, gemm).forward(theta, x)[0] for gemm in ("fast", "lut")]
    assert z[0].tobytes() == z[1].tobytes()


def test_one_engine_reused_across_calls_of_any_size_gives_a_fresh_engines_bytes(luts):
    """The fast path's grad keeps its arrays as scratch between calls (engine/convfast.py):
    calls of other sizes and parameters after it, and forward's results, must not see them."""
    rng = np.random.default_rng(5)
    spec = cnn((2, 9, 8), ["conv4", "pool", "conv6k5", "pool", 7], 5)
    eng = Engine(spec, luts, "fast")
    assert eng.conv_fast is not None
    z0 = eng.forward(init_params(spec, 1), rng.integers(0, 256, (2, 3, spec.input_dim)).astype(np.uint8))[0]
    z0_bytes = z0.tobytes()
    for n, b, seed in ((2, 3, 4), (3, 4, 1), (1, 2, 2), (3, 4, 3), (2, 5, 6)):  # first: forward's shapes
        theta = init_params(spec, seed)
        x = rng.integers(0, 256, (n, b, spec.input_dim)).astype(np.uint8)
        y = rng.integers(0, spec.classes, (n, b))
        got, want = (e.grad(theta, x, y, 40, 2.0**49) for e in (eng, Engine(spec, luts, "fast")))
        assert got.grad.tobytes() == want.grad.tobytes() and got.loss.tobytes() == want.loss.tobytes()
        assert got.correct.tobytes() == want.correct.tobytes()
    assert z0.tobytes() == z0_bytes  # forward's logits are its own, not grad's scratch


@pytest.mark.parametrize("items, channels", [(("conv4", "pool", "conv8k5", "pool"), 1),
                                             (("conv6", "pool", 16), 3)])
def test_any_split_of_a_step_gives_train_hash_on_a_conv_model(luts, items, channels):
    ds = image_digits(channels)
    spec = model_for(ds, items)
    hp = Hyper(seed=3, batch=64, micro_batch=8)

    def run(workers, how):
        tr = Trainer(spec, hp, ds, luts)
        for step in range(3):
            parts = assign(hp.n_micro, workers, how, step, hp.seed)
            tr.apply(sum(tr.contribute(p).grad for p in parts))
        return tr.params_sha256()

    ref = run(1, "round-robin")
    assert run(3, "random") == ref
    assert run(5, "capacity") == ref


def test_int8_conv_gradient_is_the_float_twins_gradient(luts, digits_image):
    """The INT8 backward (im2col, col2im, pool scatter, ReLU masks) points where the float
    model's gradient points: cosine > 0.9 overall and per tensor."""
    spec = model_for(digits_image, ("conv6", "pool", "conv8k5", "pool", 16))
    theta = init_params(spec, 4)
    x = digits_image.x_train[:64].reshape(4, 16, -1)
    y = digits_image.y_train[:64].reshape(4, 16)
    S = 40
    g_int = Engine(spec, luts).grad(theta, x, y, S, 2.0**49).grad.astype(np.float64) * 2.0**-S / 4
    model = float_model(spec, theta).double()
    loss = torch.nn.functional.cross_entropy(model(torch.tensor(x.reshape(64, -1))),
                                             torch.tensor(y.reshape(-1)).long())
    loss.backward()
    params = list(model.parameters())
    g_f = np.concatenate([p.grad.numpy().ravel() for p in params])
    assert g_int @ g_f / np.linalg.norm(g_int) / np.linalg.norm(g_f) > 0.9
    o = 0
    for p in params:
        gi, gf = g_int[o:o + p.numel()], p.grad.numpy().ravel()
        o += p.numel()
        assert gi @ gf / np.linalg.norm(gi) / np.linalg.norm(gf) > 0.8


@pytest.mark.parametrize("k", [3, 5])
def test_col2im_is_the_adjoint_of_im2col_and_im2col_is_torchs_unfold(k):
    rng = np.random.default_rng(k)
    n, b, ci, h, w = 2, 3, 2, 5, 7
    a = rng.integers(-127, 128, (n, b, ci * h * w)).astype(np.float64)
    cols = C.im2col(a, ci, h, w, k)
    unf = torch.nn.functional.unfold(torch.tensor(a.reshape(n * b, ci, h, w)), k, padding=(k - 1) // 2)
    want = unf.numpy().transpose(0, 2, 1).reshape(n, b * h * w, ci * k * k)
    assert np.array_equal(cols, want)
    d = rng.integers(-2**20, 2**20, cols.shape).astype(np.float64)
    back = C.col2im(d, b, ci, h, w, k)
    assert float((cols * d).sum()) == float((a * back).sum())  # exact: integers below 2**53
    fold = torch.nn.functional.fold(torch.tensor(d.reshape(n * b, h * w, -1).transpose(0, 2, 1)),
                                    (h, w), k, padding=(k - 1) // 2)
    assert np.array_equal(back, fold.numpy().reshape(n, b, -1))


def test_maxpool_tie_rule_and_odd_sizes():
    """The first position of the scan (0,0), (0,1), (1,0), (1,1) that holds the max gets the
    error; an odd last row/column is dropped forward and gets 0 backward."""
    win = np.array([[5, 5, 5, 5], [1, 7, 3, 7], [2, 2, 9, 9], [0, 0, 0, 4], [-3, -3, -3, -3]], np.float64)
    h, w = 3, 2 * len(win) + 1  # odd both ways
    img = np.full((h, w), 100.0)
    for i, v in enumerate(win):
        img[0:2, 2 * i:2 * i + 2] = v.reshape(2, 2)
    out, arg = C.maxpool(img.reshape(1, 1, -1), 1, h, w)
    assert out.ravel().tolist() == [5, 7, 9, 4, -3]
    assert arg.ravel().tolist() == [0, 1, 2, 3, 0]
    g = np.arange(1, 6, dtype=np.float64).reshape(1, 1, -1)
    back = C.maxpool_back(g, arg, 1, h, w).reshape(h, w)
    want = np.zeros((h, w))
    for i, (dy, dx) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 0)]):
        want[dy, 2 * i + dx] = i + 1
    assert np.array_equal(back, want)
    assert not back[2].any() and not back[:, -1].any()


def test_layers_conv_syntax_and_the_spec_it_makes(digits_image):
    assert parse_layers("conv16,pool,conv32k5,pool,64") == ("conv16", "pool", "conv32k5", "pool", 64)
    spec = model_for(digits_image, parse_layers("conv16,pool,conv32k5,pool,64"))
    assert [l.type for l in spec.layers] == ["conv2d", "relu", "maxpool2d", "conv2d", "relu", "maxpool2d",
                                             "linear", "relu", "linear"]
    assert spec.layers[3] == Layer("conv2d", 16, 32, 5, 4, 4)
    assert spec.layers[6] == Layer("linear", 32 * 2 * 2, 64)
    assert layers_text(spec) == "conv16,pool,conv32k5,pool,64"
    assert ModelSpec.from_json(spec.to_json()) == spec
    assert model_for(digits_image, None) == cnn((1, 8, 8), ("conv16", "pool", "conv32", "pool", "conv64", "pool"), 10)
    names = [n for n, _ in spec.param_shapes()]
    assert names == ["layers.0.weight", "layers.0.bias", "layers.3.weight", "layers.3.bias",
                     "layers.6.weight", "layers.6.bias", "layers.8.weight", "layers.8.bias"]


@pytest.mark.parametrize("text, words", [("conv16k4", "kernel size must be 3 or 5"), ("convx", "unknown --layers item"),
                                         ("conv0", "1 to 4096 filters"), ("pool2", "comma-separated")])
def test_bad_conv_items_are_usage_errors(text, words):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--layers", text])
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        parse_layers(text)


def test_refusals_pool_on_1x1_conv_on_dense_and_the_parameter_cap(digits_image):
    with pytest.raises(SpecError, match="maxpool2d on a 1x1 map"):
        model_for(digits_image, ("pool", "pool", "pool", "pool"))
    with pytest.raises(SpecError, match="after a dense layer"):
        model_for(digits_image, ("conv4", 32, "conv8"))
    with pytest.raises(SpecError, match="need an image input"):
        from daisychain.engine.data import load_digits
        model_for(load_digits(), ("conv4", "pool"))
    with pytest.raises(SpecError, match="parameters is more than"):
        cnn((1, 64, 64), ("conv16", 1000), 10)
    with pytest.raises(SpecError, match="values per sample"):
        cnn((3, 1024, 1024), ("conv8",), 10)
    bad = mlp(64, 8, 10).to_json()
    bad["layers"].insert(0, {"type": "conv2d", "in_channels": 1, "out_channels": 2, "kernel": 3,
                             "height": 8, "width": 8})
    with pytest.raises(SpecError, match="conv2d needs an image-shaped input"):
        ModelSpec.from_json(bad)
    js = cnn((1, 8, 8), ("conv4",), 10).to_json()
    js["layers"][0]["kernel"] = 4
    with pytest.raises(SpecError, match="kernel must be one of"):
        ModelSpec.from_json(js)
    js["layers"][0]["kernel"] = 3
    js["input"]["height"] = 9
    with pytest.raises(SpecError, match="image input dim"):
        ModelSpec.from_json(js)


def test_unit_counts_of_a_conv_model():
    """conv: a linear over b*H*W rows with in = Ci*k*k (forward + weight gradient, no input
    error as the first layer), its requantize b*Co*H*W; the ReLU on the map; the linear
    after the pool passes a requantized error of b*64 down; the pool runs no unit."""
    from daisychain.engine.counters import unit_counts_per_micro_batch

    spec = cnn((1, 8, 8), ("conv4", "pool"), 10)
    got = unit_counts_per_micro_batch(spec, 16)
    per = 16 * 64 * 9 * 4
    assert got == {"multiply": 2 * per + 3 * 16 * 64 * 10, "requantize": 16 * 64 * 4 + 16 * 64,
                   "relu": 16 * 64 * 4}


def test_weight_gradients_split_into_int32_safe_chunks_give_the_same_bytes(luts, monkeypatch):
    """A conv's weight gradient has inner size b*H*W, which may pass the int32 limit
    (MAX_K): the literal engine and the compiled path split it into chunks summed in int64.
    With the limit made tiny, every split must still give the unsplit bytes."""
    from daisychain.engine import convfast, model

    spec = cnn((2, 6, 5), ("conv3", "pool", "conv4k5"), 4)
    rng = np.random.default_rng(9)
    theta = init_params(spec, 9)
    x = rng.integers(0, 256, (2, 3, spec.input_dim)).astype(np.uint8)
    y = rng.integers(0, 4, (2, 3))
    want = Engine(spec, luts, "fast").grad(theta, x, y, 40, 2.0**49).grad
    monkeypatch.setattr(model, "MAX_K", 7)
    monkeypatch.setattr(convfast, "MAX_K", 5)
    for gemm in ("lut", "fast"):
        assert Engine(spec, luts, gemm).grad(theta, x, y, 40, 2.0**49).grad.tobytes() == want.tobytes()


def test_without_numba_a_conv_model_trains_to_the_same_hash(luts):
    """The compiled image path needs numba; without it (DAISYCHAIN_NO_NUMBA) the reference
    path runs, to the same hash."""
    import os
    import subprocess
    import sys

    code = ("from daisychain.engine.golden import image_digits; from daisychain.engine.data import model_for;"
            "from daisychain.engine.spec import Hyper; from daisychain.engine.trainer import Trainer;"
            "from daisychain.units import load_luts; import sys\n"
            "ds = image_digits(1); tr = Trainer(model_for(ds, ('conv4', 'pool', 10)), Hyper(seed=6), ds, load_luts())\n"
            "for _ in range(3): tr.apply(tr.contribute(range(4)).grad)\n"
            "print(tr.params_sha256(), 'numba' in sys.modules)")
    env = dict(os.environ, DAISYCHAIN_NO_NUMBA="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    sha, numba_loaded = r.stdout.split()
    ds = image_digits(1)
    tr = Trainer(model_for(ds, ("conv4", "pool", 10)), Hyper(seed=6), ds, luts)
    for _ in range(3):
        tr.apply(tr.contribute(range(4)).grad)
    assert tr.engine.conv_fast is not None and sha == tr.params_sha256()
    assert numba_loaded == "False"
