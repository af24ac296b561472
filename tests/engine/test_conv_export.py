"""A conv model leaves and re-enters DaisyChain like an MLP: checkpoint save / load / resume
ends on the uninterrupted hash, the peer state encoding round-trips, `daisychain export` to
safetensors (exact int8 + scales of the 4-D conv weights) and ONNX (uint8 pixels in),
torch_model (an nn.Sequential of Conv2d / ReLU / MaxPool2d / Flatten / Linear) predicts
what the engine predicts, and `train --float` trains the same CNN in torch float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from daisychain.engine.checkpoint import (decode_state, encode_state, read_checkpoint_file, run_flags,
                                          write_checkpoint_file)
from daisychain.engine.data import model_for
from daisychain.engine.detmath import quant_exponent, quantize
from daisychain.engine.floatref import train_float
from daisychain.engine.golden import image_digits
from daisychain.engine.settings import RunSettings
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer, TrainState
from daisychain.export import export, torch_model
from daisychain.units import load_luts

ITEMS = ("conv8", "pool", "conv16k5", "pool", 32)
MIN_AGREEMENT = 0.99


def _steps(tr, k):
    for _ in range(k):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    ds = image_digits(3)
    tr = Trainer(model_for(ds, ITEMS), Hyper(seed=2), ds, load_luts())
    _steps(tr, 120)
    path = tmp_path_factory.mktemp("conv") / "run.pt"
    write_checkpoint_file(path, tr.identity, tr.state.step, tr.theta, tr.state.adam)
    return path, ds, tr, tr.engine.predict(tr.theta, ds.x_test, tr.hp.micro_batch)


def test_checkpoint_resume_ends_on_the_uninterrupted_hash(tmp_path):
    ds = image_digits(1)
    spec = model_for(ds, ("conv4", "pool", "conv8", "pool"))
    hp = Hyper(seed=7, batch=32, micro_batch=8)
    whole = Trainer(spec, hp, ds, load_luts())
    _steps(whole, 6)
    first = Trainer(spec, hp, ds, load_luts())
    _steps(first, 3)
    path = tmp_path / "a.pt"
    write_checkpoint_file(path, first.identity, first.state.step, first.theta, first.state.adam)
    ck = read_checkpoint_file(path, first.identity)
    again = Trainer(spec, hp, ds, load_luts())
    again.state = TrainState(ck.theta.copy(), ck.adam, ck.step)
    _steps(again, 3)
    assert again.params_sha256() == whole.params_sha256()
    st = decode_state(encode_state(first.identity, 3, first.theta, first.state.adam), first.identity)
    assert st.step == 3 and np.array_equal(st.theta, first.theta)
    assert "--layers conv4,pool,conv8,pool" in run_flags(first.identity)


def test_safetensors_holds_the_exact_int8_conv_weights(trained, tmp_path):
    from safetensors.torch import load_file

    ck, ds, tr, _ = trained
    out = tmp_path / "m.safetensors"
    export(ck, out)
    t = load_file(str(out))
    for name, w in zip(tr.layout.names, tr.layout.views(tr.theta)):
        assert tuple(t[name].shape) == w.shape
        if name.endswith("weight"):
            e = int(quant_exponent(np.abs(w).max()))
            assert np.array_equal(t[f"{name}.int8"].numpy(), quantize(w, e).astype(np.int8))
            assert torch.equal(t[name], t[f"{name}.int8"].float() * t[f"{name}.scale"])
    assert t["layers.0.weight"].shape == (8, 3, 3, 3) and t["layers.3.weight"].shape == (16, 8, 5, 5)
    a, b = torch_model(out).state_dict(), torch_model(ck).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_torch_model_and_onnx_predict_what_the_engine_predicts(trained, tmp_path):
    ck, ds, tr, engine_pred = trained
    model = torch_model(ck)
    kinds = [type(m).__name__ for m in model.layers if type(m).__name__ != "Module"]
    assert [k for k in kinds if k != "ImageInput"] == ["Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU",
                                                       "MaxPool2d", "Flatten", "Linear", "ReLU", "Linear"]
    assert isinstance(model.layers, torch.nn.Sequential)
    assert float((engine_pred == ds.y_test).mean()) > 0.8  # it learned something
    pred = model.predict(ds.x_test)
    assert float((pred == engine_pred).mean()) >= MIN_AGREEMENT
    imgs = ds.x_test.reshape(-1, 3, 8, 8)  # (N, C, H, W) and one (C, H, W) image
    assert np.array_equal(model.predict(imgs), pred) and model.predict(imgs[0]) == pred[0]
    with pytest.raises(ValueError, match="pixels"):
        model.predict(np.full((1, 192), 300))
    out = tmp_path / "m.onnx"
    export(ck, out)
    import onnxruntime as ort

    s = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    onnx_pred = s.run(["logits"], {"x": ds.x_test})[0].argmax(axis=1)
    assert float((onnx_pred == engine_pred).mean()) >= MIN_AGREEMENT


def test_train_float_trains_the_same_cnn_in_torch():
    ds = image_digits(1)
    spec = model_for(ds, ("conv8", "pool", "conv16", "pool"))
    rs = RunSettings(ds, spec, Hyper(seed=1), 150)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's threads fight the other tests for this machine's cores
    try:
        got = train_float(rs, quiet=True)
    finally:
        torch.set_num_threads(threads)
    tr = Trainer(spec, rs.hp, ds, load_luts())
    _steps(tr, 150)
    assert got["accuracy"] > 0.85
    assert abs(got["accuracy"] - tr.accuracy()) < 0.05, (got["accuracy"], tr.accuracy())
