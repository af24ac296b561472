"""The layer and path registries (docs/ARCHITECTURE.md, "Where a new thing goes"):

- the compute path an Engine takes is the first of engine/paths.py PATHS whose
  ``accepts(spec)`` says yes (the literal one where the tables are not their definitions);
- no module outside the registry branches on a layer type string, in either language: the
  rest of the tree asks the kind (``kind_of(l).head``, ``kindOf(l).folds``, ...);
- the JS kinds state the same facts as the Python kinds.

The static checks are tried on planted faults, so that they are shown to catch one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from daisychain.engine.layers import LAYERS, kind_of
from daisychain.engine.model import Engine
from daisychain.engine.paths import LITERAL, PATHS, choose
from daisychain.engine.spec import ModelSpec, char_mlp, cnn, gpt, mlp
from daisychain.units import load_luts
from tests.jsrun import run_js

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "daisychain"
WEBUI = PKG / "webui"
#: the registry: the one place a layer's type string may be compared
PY_REGISTRY = {"engine/layers.py", "engine/layer_base.py", "engine/attention.py"}
JS_REGISTRY = {"engine/registry.js", "engine/layers.js", "engine/transformer.js"}
#: modules not yet moved onto the registry (by file name, wherever its folder), with the reason
JS_NOT_YET: dict[str, str] = {}
TYPES = frozenset(LAYERS)
#: what a --layers item of a kind starts with (its type string's stand-in in item text)
ITEM_WORDS = TYPES | {"conv", "pool"}

_image = (1, 8, 8)
MODELS = {  # name: (spec, gemm, the path it must take)
    "mlp": (lambda: mlp(6, [5, 4], 3), "fast", "dense"),
    "mlp on the lut route": (lambda: mlp(6, 5, 3), "lut", "literal"),
    "char mlp": (lambda: char_mlp(7, 3, 4, 5), "fast", "literal"),
    "cnn": (lambda: cnn(_image, ["conv3", "pool", 6], 4), "fast", "conv"),
    "cnn on the lut route": (lambda: cnn(_image, ["conv3", "pool"], 4), "lut", "literal"),
    "cnn with mse": (lambda: ModelSpec.from_json({**cnn(_image, ["conv3", "pool"], 2).to_json(), "loss": "mse"}),
                     "fast", "literal"),
    "gpt": (lambda: gpt(9, 4, ["block8h2"]), "fast", "attnfast"),
    "gpt on the lut route": (lambda: gpt(9, 4, ["block8h2"]), "lut", "literal"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_takes_the_path_that_accepts_it(name):
    make, gemm, want = MODELS[name]
    spec = make()
    eng = Engine(spec, load_luts(), gemm=gemm)
    accepting = [p for p in PATHS if p.accepts(spec)]
    assert accepting[-1] is LITERAL  # the literal path accepts every spec
    first = accepting[0] if gemm == "fast" else LITERAL  # load_luts(): tables equal their definitions
    assert eng.path is first is choose(spec, eng.rq_arith)
    assert eng.path.name == want
    for p in PATHS:  # the chosen path's object is opened into its attribute, no other path's
        if p.attr is not None and p is not eng.path:
            assert getattr(eng, p.attr) is None
    if eng.path.whole:
        assert getattr(eng, eng.path.attr) is eng.whole is not None
    else:
        assert eng.whole is None


# ------------------------------------------------------------------ the static checks
def _type_consts(node) -> set[str]:
    """The layer type / item strings that ``node`` holds (a constant, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & ITEM_WORDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_type_consts(e) for e in node.elts)) if node.elts else set()
    return set()


def python_type_branches(text: str) -> list[str]:
    """Comparisons of a ``.type`` with a layer type string, and ``startswith`` /
    ``endswith`` / ``==`` on an item word: ``line: code``."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            typed = any(isinstance(s, ast.Attribute) and s.attr == "type" for s in sides)
            if typed and any(_type_consts(s) & TYPES for s in sides):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")
              and any(_type_consts(a) for a in node.args)):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


_JS_TYPE = "|".join(sorted(TYPES))
_JS_WORD = "|".join(sorted(ITEM_WORDS))
JS_BRANCH = re.compile(rf"""\.type\s*[!=]==?\s*["']({_JS_TYPE})["']"""
                       rf"""|["']({_JS_TYPE})["']\s*[!=]==?\s*[^;&|?:]*?\.type\b"""
                       rf"""|\.(?:startsWith|endsWith)\(\s*["']({_JS_WORD})""")


def js_type_branches(text: str) -> list[str]:
    return [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in JS_BRANCH.finditer(text)]


def test_no_python_module_outside_the_registry_branches_on_a_layer_type():
    found = {}
    files = [p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 50
    for p in files:
        rel = p.relative_to(PKG).as_posix()
        if rel not in PY_REGISTRY:
            hits = python_type_branches(p.read_text())
            if hits:
                found[rel] = hits
    assert not found, f"ask the kind (engine/layers.py kind_of), not its type string: {found}"


def test_no_js_module_outside_the_registry_branches_on_a_layer_type():
    found = {}
    files = [p for p in WEBUI.rglob("*.js") if "node_modules" not in p.parts]
    assert len(files) > 50
    for p in files:
        rel = p.relative_to(WEBUI).as_posix()
        if rel not in JS_REGISTRY and p.name not in JS_NOT_YET:
            hits = js_type_branches(p.read_text())
            if hits:
                found[rel] = hits
    assert not found, f"ask the kind (engine/registry.js kindOf), not its type string: {found}"
    for name in JS_NOT_YET:  # an exception that is no longer needed is dropped from the list
        (path,) = WEBUI.rglob(name)
        assert js_type_branches(path.read_text()), f"{name} branches on no layer type now"


def test_the_static_checks_catch_planted_branches():
    assert python_type_branches('if l.type == "conv2d":\n    pass\n')
    assert python_type_branches('x = kind_of(l).type in ("linear", "relu")\n')
    assert python_type_branches('b = t.startswith(("conv", "block"))\n')
    assert not python_type_branches('if op == "linear":\n    pass\nif kind_of(l).head:\n    pass\n')
    assert js_type_branches('if (l.type === "posembed") rows = 1;')
    assert js_type_branches('const x = "relu" !== layers[li + 1].type;')
    assert js_type_branches('t.startsWith("block")')
    assert not js_type_branches('if (kindOf(l).folds) x = 1; if (m.type === "error") y();')


def test_the_js_kinds_state_the_python_kinds_facts():
    got = run_js("""
const out = {};
for (const [t, k] of Object.entries(R.LAYER_TYPES)) {
  out[t] = { head: !!k.head, folds: !!k.folds, reads_tokens: !!k.readsTokens, sequence: !!k.sequence,
    op: k.op ?? "", stack: k.stack ?? "", item: k.item ? k.item.source.replace(/^\\^|\\$$/g, "") : null };
}
console.log(JSON.stringify(out));""", imports={"R": "engine/registry.js"})
    want = {t: {"head": k.head, "folds": k.folds, "reads_tokens": k.reads_tokens, "sequence": k.sequence,
                "op": k.op, "stack": k.stack, "item": k.item.pattern if k.item is not None else None}
            for t, k in LAYERS.items()}
    assert got == want


def test_a_kinds_op_is_what_it_lowers_to():
    """The ``op`` fact (what units/gpu_plan.js asks in JS) is the op a compiled path lowers
    the kind to (``lower``), and a kind without one is folded or not lowered."""
    seen = set()
    for spec in (cnn(_image, ["conv3", "pool", 6], 4), mlp(6, [5, 4], 3)):
        for li, l in enumerate(spec.layers):
            low = kind_of(l).lower(l, li, spec.layers)
            assert (low[0] if low else "") == kind_of(l).op, l
            seen.add(kind_of(l).op)
    assert seen == {"linear", "conv", "pool", ""}
