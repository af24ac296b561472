"""/selftest?task=image&layers=...: a conv model trained in the page as `daisychain train`
does, in a WebGPU tab (the WGSL kernels), in a tab without WebGPU (the JS units) and in the
numpy trainer: the same parameter hash and test accuracy, on a grey and on an RGB image set served by a real
server (a small synthetic uint8 set, so that the test does not depend on a data route)."""

from __future__ import annotations

import numpy as np
import pytest
from browser_helpers import open_page, run_selftest
from conv_server import serving

from daisychain.engine.data import Dataset, model_for
from daisychain.engine.settings import parse_layers
from daisychain.engine.spec import Hyper
from daisychain.engine.task_defaults import TASK_DEFAULTS, defaults
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

pytestmark = pytest.mark.browser


def image_set(task: str, c: int, h: int, w: int, classes: int = 4, n_train: int = 160, n_test: int = 48) -> Dataset:
    """Class k: a bright square at a place of its own, on noise; fixed by a seed."""
    rng = np.random.default_rng(11)

    def make(n):
        y = rng.integers(0, classes, n).astype(np.int32)
        x = rng.integers(0, 90, (n, c, h, w)).astype(np.uint8)
        for i, k in enumerate(y):
            oy, ox = (k // 2) * (h // 2), (k % 2) * (w // 2)
            x[i, :, oy:oy + h // 2, ox:ox + w // 2] += np.uint8(150)
        return x.reshape(n, c * h * w), y

    xtr, ytr = make(n_train)
    xte, yte = make(n_test)
    return Dataset(task, xtr, ytr, xte, yte, classes=classes, meta={"image_shape": [c, h, w]})


SETS = {"image": lambda: image_set("image", 1, 12, 12), "imagergb": lambda: image_set("imagergb", 3, 8, 8)}


@pytest.fixture(scope="module")
def image_server():
    """The real server app on loopback, serving the two image sets at /data/<task>.dcds."""
    with serving({task: make() for task, make in SETS.items()}) as url:
        yield url


@pytest.mark.parametrize("task, layers", [("image", "conv4,pool,conv8k5,pool"), ("imagergb", "conv6,pool,16")])
def test_conv_model_trains_to_the_same_hash_in_a_webgpu_tab_and_a_cpu_tab(browser_webgpu, browser_nogpu,
                                                                          image_server, task, layers):
    query = f"task={task}&layers={layers}&steps=3&seed=2"
    results = {}
    for path, browser in (("gpu", browser_webgpu), ("cpu", browser_nogpu)):
        page = open_page(browser, f"{path}-tab")
        try:
            results[path] = run_selftest(page, f"{image_server}/selftest?{query}&path={path}")
        finally:
            page.close()
    for path, r in results.items():
        t = r["training"]
        assert r["error"] is None, r["error"]
        assert t["path_used"] == path and t["fallback"] is None, t
        types = [l["type"] for l in t["model"]["layers"]]
        assert types[:3] == ["conv2d", "relu", "maxpool2d"] and types[-1] == "linear", types
        assert t["model"]["input"]["kind"] == "image"
        assert t["params_sha256"] and 0.0 <= t["accuracy"] <= 1.0
    assert results["gpu"]["training"]["params_sha256"] == results["cpu"]["training"]["params_sha256"]
    assert results["gpu"]["training"]["run_id"] == results["cpu"]["training"]["run_id"]
    # numpy: the same model, settings and data in the Python trainer
    ds = SETS[task]()
    spec = model_for(ds, parse_layers(layers))
    assert results["cpu"]["training"]["model"] == spec.to_json()
    d = defaults(task, 3) if task in TASK_DEFAULTS else defaults("digits", 3)  # /selftest: the CLI's task defaults
    hp = Hyper(seed=2, lr=d["lr"], augment_shift=d["augment_shift"], lr_warmup=d["lr_warmup"],
               lr_decay_steps=d["lr_decay_steps"])
    tr = Trainer(spec, hp, ds, load_luts())
    for _ in range(3):
        tr.apply(tr.contribute(list(range(tr.hp.n_micro))).grad)
    assert results["gpu"]["training"]["params_sha256"] == tr.params_sha256()
    assert results["gpu"]["training"]["accuracy"] == tr.accuracy()


def test_conv_model_with_the_image_recipe_trains_to_the_numpy_hash_in_both_tabs(browser_webgpu, browser_nogpu,
                                                                              image_server):
    """The image recipe (shift augmentation, warm-up / decay learning rate) in a tab: the JS
    Trainer used to refuse a run that set it, so no tab could train (or join) a default
    `--task image` run. Both paths must end on the numpy trainer's hash with the same settings."""
    recipe = {"augment_shift": 2, "lr_warmup": 2, "lr_decay_steps": 5}
    query = "task=image&layers=conv4,pool,16&steps=4&seed=5&batch=32&micro-batch=8&" + "&".join(
        f"{k.replace('_', '-')}={v}" for k, v in recipe.items())
    results = {}
    for path, browser in (("gpu", browser_webgpu), ("cpu", browser_nogpu)):
        page = open_page(browser, f"{path}-recipe-tab")
        try:
            results[path] = run_selftest(page, f"{image_server}/selftest?{query}&path={path}")
        finally:
            page.close()
    ds = SETS["image"]()
    hp = Hyper(seed=5, batch=32, micro_batch=8, lr=defaults("image")["lr"], **recipe)  # the task's lr
    tr = Trainer(model_for(ds, parse_layers("conv4,pool,16")), hp, ds, load_luts())
    for _ in range(4):
        tr.apply(tr.contribute(list(range(hp.n_micro))).grad)
    plain = Trainer(model_for(ds, parse_layers("conv4,pool,16")), Hyper(seed=5, batch=32, micro_batch=8), ds, load_luts())
    for _ in range(4):
        plain.apply(plain.contribute(list(range(hp.n_micro))).grad)
    assert plain.params_sha256() != tr.params_sha256()  # the recipe changes the bits
    for path, r in results.items():
        t = r["training"]
        assert r["error"] is None, r["error"]
        assert t["path_used"] == path and t["fallback"] is None, t
        assert t["run_id"] == tr.run_id
        assert t["params_sha256"] == tr.params_sha256(), path
        assert t["accuracy"] == tr.accuracy()
