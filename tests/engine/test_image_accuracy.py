"""The INT8 engine learns pictures as torch float32 does: on a Fashion-MNIST-shaped .npz
(synthetic garments, bench/image_recipe.fashion_like, 28x28 grey, 10 classes, resized to
14x14 to keep the test short) a small CNN's test accuracy after the same steps and settings
(augmentation and learning-rate schedule included) is within 1 point of ``train --float``'s.
Accuracy, not time, is asserted; docs/BENCHMARKS.md has the full-size numbers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


def test_engine_within_one_point_of_float_on_fashion_shaped_npz(tmp_path):
    import torch

    from daisychain.engine.cli import train
    from daisychain.engine.floatref import train_float
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    from image_recipe import fashion_like

    path = fashion_like(tmp_path / "fashion.npz", n_train=3000, n_test=1000, seed=1)
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(
        ["--task", "image", "--data", str(path), "--image-size", "14", "--layers",
         "conv8,pool,conv16,pool", "--steps", "300", "--batch", "32", "--micro-batch", "8",
         "--seed", "1"]))
    assert rs.hp.augment_shift == 2 and rs.hp.lr_decay_steps == 300
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flt = train_float(rs, quiet=True)["accuracy"]
    finally:
        torch.set_num_threads(threads)
    eng = train(rs, quiet=True)["accuracy"]
    assert eng > 0.85 and flt > 0.85  # it learned (nearest-centroid gets ~0.84 at 28x28)
    assert abs(eng - flt) <= 0.01, (eng, flt)
