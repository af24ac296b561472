"""The local-steps runs the tests share: a tiny text run, its local-steps settings and the
pinned hash of ``daisychain train`` with them (the JS twin must match it)."""

from __future__ import annotations

import argparse

from daisychain.engine.cli import train
from daisychain.engine.settings import add_run_arguments, settings_from_args

#: a tiny text run: a round of R=3, H=2 takes a few milliseconds
TINY = ["--task", "text", "--hidden", "16", "--embed-dim", "4", "--context", "4", "--batch", "16",
        "--micro-batch", "4", "--seed", "3"]
LOCAL = [*TINY, "--replicas", "3", "--sync-every", "2", "--outer-lr", "0.7", "--outer-momentum", "0.9"]
#: the pinned hash of `daisychain train` with LOCAL and --steps 4 (the JS twin must match it)
LOCAL_SHA = "f10bb642b84dea94ff18ab119150774e51b414dedbea8083df0c512c5d4f36cb"


def settings(steps: int, *argv: str):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(["--steps", str(steps), *argv]))


def sha(steps: int, *argv: str, **kw) -> str:
    return train(settings(steps, *argv), quiet=True, **kw)["params_sha256"]


#: the start of a node driver on a run's dataset (run_js; argv: the LUT folder and the dataset
#: file; DATA: a job with the dataset's fingerprint; D: engine/data.js): luts, job, ds
JS_RUN_SETUP = r"""
const [lutDir, dataPath] = process.argv.slice(2);
const rd = (n) => { const b = readFileSync(`${lutDir}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"),
  manifestSha256: JSON.parse(readFileSync(`${lutDir}/manifest.json`)).manifest_sha256 };
const job = DATA;
const ds = D.parseDataset(readFileSync(dataPath));
ds.fingerprint = job.fingerprint;
"""
