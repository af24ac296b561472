"""The JS twin of local steps (webui/engine/local.js) ends every round on the hash of
daisychain/engine/local.py, for a power-of-two and another replica count, with the round's
replicas computed in separate contributions (in a shuffled order) and each inner step's
micro-batches split in two: the sums are exact integers, so the bits do not move."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain import package_path
from daisychain.engine.local import LocalTrainer
from daisychain.units import load_luts
from jsrun import run_js
from local_cases import JS_RUN_SETUP, LOCAL, LOCAL_SHA, TINY, settings

DRIVER = JS_RUN_SETUP + r"""
const spec = S.ModelSpec.fromJson(job.model);
const hyper = S.makeHyper(job.hyper);
const tr = await L.makeTrainer({ spec, hyper, dataset: ds, luts, units: new P.CpuUnits(luts) });
const n = hyper.batch / hyper.micro_batch;
const split = (s) => [Array.from({ length: n }, (_, i) => i).filter((i) => (i + s) % 2), Array.from({ length: n }, (_, i) => i).filter((i) => !((i + s) % 2))].filter((a) => a.length);
const shas = [];
for (let r = 0; r < job.rounds; r++) {
  const total = new Float64Array(tr.totalSize);
  for (const j of job.orders[r]) {
    const c = await tr.contribute([j], tr.step, tr.theta.slice(), split);
    for (let i = 0; i < total.length; i++) total[i] += c.grad[i];
  }
  tr.apply(total);
  shas.push(await tr.paramsSha256());
}
const back = tr.snapshot();
tr.load(back);
console.log(JSON.stringify({ shas, local: tr instanceof L.LocalTrainer, step: tr.step, inner: tr.inner,
  run_id: await T.runId(T.runIdentity(spec, hyper, ds, luts)) }));
"""


def python_rounds(rs, rounds: int) -> list[str]:
    tr = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())
    out = []
    for _ in range(rounds):
        tr.apply(tr.contribute(range(tr.n_tasks)).grad)
        out.append(tr.params_sha256())
    return out


@pytest.mark.usefixtures("node")  # fails, never skips, without node
@pytest.mark.parametrize("argv", [
    LOCAL,  # R=3 (a division), H=2, an outer step not the default
    [*TINY, "--replicas", "2", "--sync-every", "3"],  # the default outer step
])
def test_js_local_steps_end_every_round_on_pythons_hash(tmp_path, argv):
    rounds = 4 if argv is LOCAL else 3
    rs = settings(rounds, *argv)
    want = python_rounds(rs, rounds)
    if argv is LOCAL:
        assert want[-1] == LOCAL_SHA
    data = tmp_path / "text.dcds"
    data.write_bytes(rs.ds.to_bytes())
    rng = np.random.default_rng(7)
    job = {"model": rs.spec.to_json(), "hyper": rs.hp.to_json(), "rounds": rounds,
           "fingerprint": rs.ds.fingerprint,
           "orders": [[int(j) for j in rng.permutation(rs.hp.replicas)] for _ in range(rounds)]}
    got = run_js(DRIVER, imports={"D": "engine/data.js", "S": "engine/spec.js", "T": "engine/trainer.js",
                                  "P": "engine/cpu_units.js", "L": "engine/local.js"},
                 data=job, args=[str(package_path("luts")), str(data)], timeout=300)
    assert got["local"] and got["step"] == rounds and got["inner"] == rounds * rs.hp.sync_every
    assert got["run_id"] == LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts()).run_id
    assert got["shas"] == want, (got, want)


LOCAL_CASES = [{"replicas": 0}, {"replicas": 1025}, {"sync_every": 0}, {"sync_every": 1.5},
               {"outer_lr": 0}, {"outer_lr": 5}, {"outer_momentum": 1}, {"outer_momentum": -0.1},
               {"replicas": 4, "sync_every": 8, "outer_lr": 1, "outer_momentum": 0}]
HYPER_DRIVER = """
console.log(JSON.stringify(DATA.map((c) => {
  try { return { json: hyperJson(makeHyper(c)) }; } catch (e) { return { error: e.message }; }
})));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_a_received_runs_local_settings_get_the_same_words_and_json_in_both_languages():
    from daisychain.engine.spec import Hyper, SpecError

    def py(c):
        try:
            hp = Hyper(**c)
            hp.validate()
            return {"json": hp.to_json()}
        except SpecError as exc:
            return {"error": str(exc)}

    want = [py(c) for c in LOCAL_CASES]
    assert all("error" in w for w in want[:-1]) and "json" in want[-1]
    assert run_js(HYPER_DRIVER, imports={"{ makeHyper, hyperJson }": "engine/spec.js"}, data=LOCAL_CASES) == want


REFUSALS = JS_RUN_SETUP + r"""
const tr = await L.makeTrainer({ spec: S.ModelSpec.fromJson(job.model), hyper: S.makeHyper(job.hyper),
  dataset: ds, luts, units: new P.CpuUnits(luts) });
console.log(JSON.stringify(job.cases.map(([ints, micro, step]) => tr.contributionError(ints, micro, step))));
"""


@pytest.mark.usefixtures("node")
def test_an_anchor_rounds_bad_moments_are_refused_alike_in_both_languages(tmp_path):
    """What a coordinator or member says of a contribution whose moment blocks no replica made,
    in an anchor round (its own blocks are unpacked: a negative or too wide half, a NaN or
    infinite moment, a negative second moment) and between anchors: the same words in
    local.py and local.js, and None / null for an honest one."""
    from daisychain.engine.local import pack_moments

    rs = settings(4, *LOCAL, "--moments-every", "2")
    tr = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())
    p = tr.layout.size
    tr.apply(tr.contribute(range(tr.n_tasks)).grad)  # round 0; round 1 is an anchor
    honest = tr.contribute([2]).grad.astype(np.int64)
    at = p + 4 * p * 2  # replica 2's block: [m lo, m hi, v lo, v hi]

    def with_(i, value, base=honest):
        bad = base.copy()
        bad[i] = value
        return bad

    nan_m = with_(at + p + 3, 0x7FF80000)           # m[3]'s high half: a NaN
    inf_v = with_(at + 3 * p, 0x7FF00000, with_(at + 2 * p, 0))  # v[0] = +inf
    neg_v = with_(at + 3 * p + 1, 0xBFF00000, with_(at + 2 * p + 1, 0))  # v[1] = -1.0
    cases = [
        (honest, [2], 1),
        (with_(at, -1), [2], 1),                   # a negative half
        (with_(at + p, 1 << 32), [2], 1),         # a half past 32 bits
        (nan_m, [2], 1), (inf_v, [2], 1), (neg_v, [2], 1),
        (with_(p + 1, 5), [2], 1),                 # replica 0's block, not given to it
        (honest, [2], 0),                           # moments in a round between anchors
        (honest[:-1], [2], 1),                      # one integer short
        (np.concatenate([honest[:p], *[pack_moments(np.ones(p), np.ones(p))] * 3]), [2], 1),  # others' too
    ]
    want = [tr.contribution_error(ints, micro, step) for ints, micro, step in cases]
    assert want[0] is None and all(want[1:]), want
    assert want[1] == want[2] == "replica 2: the total's moment block is not unsigned 32-bit halves"
    assert want[3] == want[4] == want[5] == "replica 2: the total's moments are not finite"
    data = tmp_path / "text.dcds"
    data.write_bytes(rs.ds.to_bytes())
    job = {"model": rs.spec.to_json(), "hyper": rs.hp.to_json(), "fingerprint": rs.ds.fingerprint,
           "cases": [[[int(x) for x in ints], micro, step] for ints, micro, step in cases]}
    got = run_js(REFUSALS, imports={"D": "engine/data.js", "S": "engine/spec.js",
                                    "P": "engine/cpu_units.js", "L": "engine/local.js"},
                 data=job, args=[str(package_path("luts")), str(data)], timeout=300)
    assert got == want
