"""Every unit the exporter trains and verifies, by name (``daisychain export-luts``)."""

from __future__ import annotations

from tqdm import tqdm

from daisychain.exporter.train_exp import train_exp
from daisychain.exporter.train_units import UnitResult, train_mul, train_relu, train_requantize

#: every unit the exporter trains, by name: the three of train_units.py and the softmax's exp
TRAINERS = {"mul": train_mul, "relu": train_relu, "requantize": train_requantize, "exp": train_exp}


def train_all(base_seed: int = 0) -> dict[str, UnitResult]:
    results = {}
    for name in tqdm(sorted(TRAINERS), desc="units", unit="unit"):
        results[name] = TRAINERS[name](base_seed)
        r = results[name]
        tqdm.write(f"  {name}: exact on its whole domain (seed {r.seed}, "
                   f"{r.seeds_tried} tried, max residual {r.max_residual:.4f})")
    return results
