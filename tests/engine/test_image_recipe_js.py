"""Unit tier (node): the JS Trainer (webui/engine/trainer.js) trains an image run with the
recipe (shift augmentation and the warm-up / decay learning rate, engine/augment.py) to
`daisychain train`'s hash. The JS Trainer used to refuse any run that set augment_shift,
lr_warmup or lr_decay_steps, so a tab could not join a default `--task image` run.

The data is `daisychain train --task image --image-size 8`'s own (the embedded MNIST, as DCDS
bytes); each JS step is computed as two contributions of interleaved micro-batches, so a
sample's shift must follow its batch slot, not its place in the list."""

from __future__ import annotations

import argparse

from daisychain import package_path
from daisychain.engine.cli import train
from daisychain.engine.settings import add_run_arguments, settings_from_args
from jsrun import run_js

DRIVER = r"""
const [lutDir, dataPath] = process.argv.slice(2);
const { parseDataset } = D;
const { ModelSpec, makeHyper } = S;
const { Trainer, runIdentity, runId } = T;
const { CpuUnits } = P;
const rd = (n) => { const b = readFileSync(`${lutDir}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"),
  manifestSha256: JSON.parse(readFileSync(`${lutDir}/manifest.json`)).manifest_sha256 };
const job = DATA;
const ds = parseDataset(readFileSync(dataPath));
ds.fingerprint = job.fingerprint;
const spec = ModelSpec.fromJson(job.model);
const hyper = makeHyper(job.hyper);
const tr = await Trainer.create({ spec, hyper, dataset: ds, luts, units: new CpuUnits(luts) });
const n = hyper.batch / hyper.micro_batch;
const odd = [], even = [];
for (let j = n - 1; j >= 0; j--) (j % 2 ? odd : even).push(j);
const shas = [];
for (let s = 0; s < job.steps; s++) {
  const a = await tr.contribute(odd);
  const b = await tr.contribute(even);
  tr.apply(a.grad.map((v, i) => v + b.grad[i]));
  shas.push(await tr.paramsSha256());
}
console.log(JSON.stringify({ shas, accuracy: await tr.accuracy(),
  run_id: await runId(runIdentity(spec, hyper, ds, luts)) }));
"""

BASE = ["--task", "image", "--image-size", "8", "--layers", "conv4,pool,16", "--steps", "4",
        "--batch", "32", "--micro-batch", "8", "--seed", "3"]


def js_train(tmp_path, rs) -> dict:
    data = tmp_path / "image.dcds"
    data.write_bytes(rs.ds.to_bytes())
    job = {"model": rs.spec.to_json(), "hyper": rs.hp.to_json(), "steps": rs.steps,
           "fingerprint": rs.ds.fingerprint}
    return run_js(DRIVER, imports={"D": "engine/data.js", "S": "engine/spec.js", "T": "engine/trainer.js",
                                   "P": "engine/cpu_units.js"},
                  data=job, args=[str(package_path("luts")), str(data)], timeout=300)


def settings(*extra: str):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args([*BASE, *extra]))


def test_js_trainer_with_the_image_recipe_ends_on_trains_hash(tmp_path):
    # warm-up over 2 updates, decay to 0 at update 5: rates lr/2, lr, lr, 2lr/3
    rs = settings("--augment-shift", "2", "--lr-warmup", "2", "--lr-decay-steps", "5")
    assert rs.hp.augment_shift == 2 and rs.hp.lr_warmup == 2 and rs.hp.lr_decay_steps == 5
    want = train(rs, quiet=True)
    got = js_train(tmp_path, rs)
    assert got["run_id"] == want["run_id"]
    assert got["shas"][-1] == want["params_sha256"]
    assert got["accuracy"] == want["accuracy"]
    # the recipe changed the bits (the comparison is not of a run that ignores it)
    plain = train(settings("--augment-shift", "0", "--lr-warmup", "0", "--lr-decay-steps", "0"), quiet=True)
    assert plain["params_sha256"] != want["params_sha256"]
