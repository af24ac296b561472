"""Unit tier (node): the JS engine's transformer (issue 37; webui/engine/transformer.js,
attention.js, norm.js) held to the numpy engine. One training step in every detail and a
20-step run on the JS units against the golden file ``step_text_gpt.json`` (fast GEMM and the
literal table GEMM); the integer rules (rshift, sdiv, isqrt, align-add, RMSNorm, the integer
softmax through the exp unit and its backward) against engine/norm.py and attention.py on
random and extreme inputs; ``--layers blockWhH`` and its refusals, the attention-scores
limit, the unit counts and the run identity (``exp_lut``) in Python's words and bits."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from jsrun import LOAD_LUTS, run_js
from step_js import assert_step, run_step

from daisychain import package_path
from daisychain.engine import norm as N
from daisychain.engine.attention import softmax_back, softmax_int
from daisychain.engine.counters import unit_counts_per_micro_batch
from daisychain.engine.data import model_for, prepare_task, with_context
from daisychain.engine.settings import check_size, parse_layers
from daisychain.engine.spec import Hyper, SpecError, gpt, layers_text
from daisychain.engine.trainer import run_id, run_identity
from daisychain.units import load_luts

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

GOLDEN = package_path("golden")


@pytest.fixture(scope="module")
def text():
    return prepare_task("text")


@pytest.mark.parametrize("path", ["cpu", "cpu-lut"])
def test_transformer_step_matches_the_golden_file(text, path):
    """step_text_gpt.json (2 blocks of width 16, 2 heads, context 8): every forward
    intermediate, each micro-batch's fixed-point gradient, Adam, 20 steps, the accuracy."""
    g = json.loads((GOLDEN / "step_text_gpt.json").read_text())
    assert_step(run_step(g, text, path), g)


def test_the_char_window_golden_still_matches(text):
    """The registry and the engine's row handling moved: the old text model keeps its bits."""
    g = json.loads((GOLDEN / "step_text_2layers.json").read_text())
    assert_step(run_step(g, text), g)


RULES = "const lutDir = process.argv[2];\n" + LOAD_LUTS + r"""
const job = DATA;
const f64 = (a) => Float64Array.from(a);
const out = {};
out.rshift = job.rshift.v.map((v, i) => N.rshift1(v, job.rshift.k[i]));
out.sdiv = job.sdiv.a.map((a, i) => N.sdiv(a, job.sdiv.m[i]));
out.isqrt = job.isqrt.map((v) => N.isqrt(v));
out.align = job.align.map((ops) => { const r = N.alignAdd(ops.map(([V, e]) => [f64(V), e])); return [Array.from(r.V), r.e]; });
out.rms = job.rms.map(({ x, R, D, g, eg, ex }) => {
  const c = N.rmsForward(f64(x), R, D);
  const b = N.rmsBackward(Int32Array.from(g), eg, ex, c, R, D);
  return { y: Array.from(c.y), q: Array.from(c.q), j: Array.from(c.j), dx: Array.from(b.V), e: b.e };
});
out.softmax = job.softmax.map(({ sc, nb, T, E }) => Array.from(A.softmaxArray(Int32Array.from(sc), nb, T, E, luts)));
out.back = job.back.map(({ P, dP, rows, T }) => Array.from(A.softmaxBack(Int32Array.from(P), Int32Array.from(dP), rows, T)));
console.log(JSON.stringify(out));
"""


def test_integer_rules_match_numpy_on_random_and_extreme_inputs():
    rng = np.random.default_rng(11)
    v = np.concatenate([rng.integers(-2**40, 2**40, 400), [0, -1, 1, -2**39, 2**39 - 1]])
    k = np.concatenate([rng.integers(0, 45, 400), [0, 1, 40, 44, 3]])
    a = rng.integers(-2**47, 2**47, 400)
    m = rng.integers(1, 2**32, 400)
    sq = np.concatenate([rng.integers(0, 2**53, 300), np.arange(1, 200) ** 2 - 1, [(2**26 + 3) ** 2 - 1, 94906265 ** 2 - 1, 2**53 - 1]])
    align = []
    for _ in range(12):
        k_ops = int(rng.integers(1, 4))
        ops = []
        for _ in range(k_ops):
            scale = int(rng.integers(0, 40))
            V = rng.integers(-2**scale, 2**scale + 1, 24).astype(np.float64) if rng.random() > 0.15 else np.zeros(24)
            ops.append((V, int(rng.integers(-40, 20))))
        align.append(ops)
    rms = []
    for R, D in ((5, 16), (3, 64)):
        x = rng.integers(-32768, 32769, (1, R, D)).astype(np.int64)
        x[0, 1] //= 3000
        x[0, 2] = 0
        g = rng.integers(-127, 128, (1, R, D))
        rms.append({"x": x.ravel().tolist(), "R": R, "D": D, "g": g.ravel().tolist(), "eg": -4, "ex": -9,
                    "_x": x, "_g": g})
    luts = load_luts()

    class Eng:
        exp_t = luts.exp.astype(np.float64)

    softmax = []
    for nb, T, E, lim in ((3, 8, -6, 2**14), (2, 5, 3, 40), (2, 16, -30, 2**22), (1, 7, -1, 2**22), (4, 4, 9, 3), (1, 6, -40, 2**22)):
        sc = rng.integers(-lim, lim + 1, (1, nb, T, T))
        softmax.append({"sc": sc.ravel().tolist(), "nb": nb, "T": T, "E": E, "_sc": sc})
    back = []
    for rows, T in ((24, 8), (10, 16)):
        P = rng.integers(0, 128, (rows, T))
        P[:, T // 2:] *= rng.random((rows, T - T // 2)) > 0.5
        dP = rng.integers(-2**21, 2**21, (rows, T))
        back.append({"P": P.ravel().tolist(), "dP": dP.ravel().tolist(), "rows": rows, "T": T, "_P": P, "_dP": dP})
    strip = lambda items: [{k: v for k, v in d.items() if not k.startswith("_")} for d in items]  # noqa: E731
    job = {"rshift": {"v": v.tolist(), "k": k.tolist()}, "sdiv": {"a": a.tolist(), "m": m.tolist()},
           "isqrt": sq.tolist(), "align": [[[V.tolist(), e] for V, e in ops] for ops in align],
           "rms": strip(rms), "softmax": strip(softmax), "back": strip(back)}
    got = run_js(RULES, {"N": "engine/norm.js", "A": "engine/attention.js"}, data=job,
                 args=[str(package_path("luts"))])
    assert got["rshift"] == N.rshift(v, k).tolist()
    assert got["sdiv"] == N.sdiv(a, m).tolist()
    assert got["isqrt"] == N.isqrt(sq).tolist()
    for ops, (V, e) in zip(align, got["align"]):
        want_V, want_e = N.align_add([(op[None], np.array([ei])) for op, ei in ops])
        assert V == want_V[0].tolist() and e == int(want_e[0])
    for case, have in zip(rms, got["rms"]):
        y, cache = N.rms_forward(case["_x"])
        assert have["y"] == y.ravel().tolist() and have["q"] == cache[1].ravel().tolist()
        assert have["j"] == cache[2].ravel().tolist()
        dx, e = N.rms_backward(case["_g"], np.array([case["eg"]]), np.array([case["ex"]]), cache)
        assert have["dx"] == dx.ravel().tolist() and have["e"] == int(e[0])
    for case, have in zip(softmax, got["softmax"]):
        want = softmax_int(Eng, case["_sc"].astype(np.float64), np.array([case["E"]]))
        assert have == want.ravel().tolist()
    for case, have in zip(back, got["back"]):
        assert have == softmax_back(case["_P"], case["_dP"]).ravel().tolist()


SPECS = r"""
const job = DATA;
const out = { results: [], counts: [], texts: [], size: [] };
const ds = job.ds;
for (const text of job.texts) {
  try {
    const spec = S.modelFor(ds, S.parseLayers(text));
    out.results.push(spec.toJson());
    out.texts.push([S.layersText(spec), S.layersText(spec.toJson())]);
    out.counts.push(S.layerUnitCounts(spec, 16));
  } catch (e) {
    if (e.name !== "SpecError") throw e;
    out.results.push(e.message);
    out.texts.push(null);
    out.counts.push(null);
  }
}
for (const [ctx, mb, items] of job.size) {
  const spec = S.gpt(45, ctx, items);
  try { S.checkSize(spec, S.makeHyper({ micro_batch: mb, batch: mb })); out.size.push(null); } catch (e) { out.size.push(e.message); }
}
try { S.modelFor({ kind: "dense", task: "digits", x_train: { shape: [1, 64] }, classes: 10 }, ["block16h2"]); } catch (e) { out.dense = e.message; }
const spec = S.ModelSpec.fromJson(job.model);
out.identity = T.runIdentity(spec, S.makeHyper(job.hyper), { fingerprint: "f", task: "text" }, job.luts);
out.run_id = await T.runId(out.identity);
console.log(JSON.stringify(out));
"""


def test_layers_blocks_refusals_counts_and_identity_match_python(text):
    """`--layers blockWhH` in the page (spec.js parseLayers + modelFor, what the settings form
    and /selftest call): the same spec, the same one-line refusal, word for word."""
    texts = ["block16h2", "block16h2,block16h4", "block16h3", "block16h2,block32h2", "block16h2,64",
             "block4h1", "block2048h2", "block16h0", "block16h100", "block", "blockx", "block16", "block1024h2",
             ",".join(["block16h2"] * 17), "block16h2, block16h2", "block 16h2", "32,block16h2", "conv8,block16h2"]
    size = [[256, 64, ["block64h64"]], [256, 1, ["block64h64"]], [32, 16, ["block64h4"]]]
    ds = {"kind": "tokens", "task": "text", "x_train": {"shape": [1, 8]}, "classes": text.classes}
    spec = model_for(text, ("block16h2", "block16h2"))
    hp = Hyper(seed=5)
    luts = load_luts()
    got = run_js(SPECS, {"S": "engine/spec.js", "T": "engine/trainer.js"}, data={
        "texts": texts, "ds": ds, "size": size, "model": spec.to_json(), "hyper": hp.to_json(),
        "luts": {"manifestSha256": luts.manifest_sha256, "expSha256": luts.exp_sha256}})
    for t, have, counts, names in zip(texts, got["results"], got["counts"], got["texts"]):
        try:
            want_spec = model_for(text, parse_layers(t))
            want = want_spec.to_json()
        except (argparse.ArgumentTypeError, SpecError) as exc:
            want, want_spec = str(exc), None
        assert have == want, t
        if want_spec is not None:
            assert counts == unit_counts_per_micro_batch(want_spec, 16), t
            assert names == [layers_text(want_spec)] * 2
    assert sum(isinstance(r, dict) for r in got["results"]) >= 3
    for (ctx, mb, items), have in zip(size, got["size"]):
        try:
            check_size(gpt(text.classes, ctx, items), Hyper(micro_batch=mb, batch=mb))
            want = None
        except SpecError as exc:
            want = str(exc)
        assert have == want
    assert got["size"][0] and got["size"][1] is None
    assert got["dense"] == "transformer blocks read a text (--task text), not the digits task"

    class DS:
        fingerprint, task = "f", "text"

    want = run_identity(spec, hp, DS, luts)
    assert got["identity"] == want and want["exp_lut"] == luts.exp_sha256
    assert got["run_id"] == run_id(want)


def test_a_longer_context_windows_the_same_text(text):
    """The transformer reads --context windows of the text: block16h2 at context 16."""
    ds = with_context(text, 16)
    spec = model_for(ds, ("block16h2",))
    assert spec.input_dim == 16 and spec.layers[1].n_in == 16


def test_the_end_cards_command_remakes_a_transformer_run(text):
    """ui_format.js trainCommand of a transformer's identity at context 16 names its blocks
    and its context: `daisychain train` with those words makes the same run."""
    import shlex

    from daisychain.engine.settings import add_run_arguments, settings_from_args

    spec = model_for(with_context(text, 16), ("block16h2", "block16h4"))
    hp = Hyper(seed=9, batch=32, micro_batch=8)

    class DS:
        fingerprint, task = "f", "text"

    ident = run_identity(spec, hp, DS, load_luts())
    got = run_js("console.log(JSON.stringify(F.trainCommand(DATA, null, 5)));", {"F": "page/ui_format.js"}, data=ident)
    words = shlex.split(got)
    assert words[:2] == ["daisychain", "train"] and "--context" in words and "block16h2,block16h4" in words
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(words[2:]))
    assert rs.spec.to_json() == spec.to_json() and rs.hp.to_json() == hp.to_json()


def test_js_local_steps_train_a_transformer_to_pythons_hash(tmp_path):
    """Local steps (webui/engine/local.js) with a transformer: 2 replicas, 2 inner steps, the
    replicas' contributions in a shuffled order and split in two, every round on the hash of
    engine/local.py."""
    from local_cases import settings
    from test_local_steps_js import DRIVER, python_rounds

    from daisychain.engine.local import LocalTrainer

    rounds = 2
    rs = settings(rounds, "--task", "text", "--layers", "block8h2", "--context", "4", "--batch", "16",
                  "--micro-batch", "4", "--seed", "3", "--replicas", "2", "--sync-every", "2")
    want = python_rounds(rs, rounds)
    data = tmp_path / "text.dcds"
    data.write_bytes(rs.ds.to_bytes())
    head, tail = DRIVER.split("const job = DATA;", 1)  # its tables, with the exp unit's
    driver = "const [lutDir, dataPath] = process.argv.slice(2);\n" + LOAD_LUTS + "const job = DATA;" + tail
    assert "const luts" in head
    job = {"model": rs.spec.to_json(), "hyper": rs.hp.to_json(), "rounds": rounds,
           "fingerprint": rs.ds.fingerprint, "orders": [[1, 0], [0, 1]]}
    got = run_js(driver, imports={"D": "engine/data.js", "S": "engine/spec.js", "T": "engine/trainer.js",
                                  "P": "engine/cpu_units.js", "L": "engine/local.js"},
                 data=job, args=[str(package_path("luts")), str(data)], timeout=300)
    assert got["local"] and got["step"] == rounds
    assert got["run_id"] == LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts()).run_id
    assert got["shas"] == want
