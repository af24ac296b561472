"""The shape of the tree (docs/ARCHITECTURE.md), read from the code itself:

- no import circle in ``daisychain/``, in either language: Python modules (every import,
  a function's own imports too; ``if TYPE_CHECKING:`` blocks aside) and the page's JS
  modules (static ``import``/``export ... from`` and dynamic ``import("./...")``);
- the page's JS folders import downward only: units/, engine/ and wasm/ are one level, then
  wire/, run/, shell/, page/ (nothing in engine/ imports shell/ or page/; no JS file is left
  at webui/'s root, where scripts/move_webui.py's table moved them from);
- no product file over 600 lines (Python, JS, WGSL, WAT, HTML, CSS);
- no ``# ring hook`` left: the roles reach the ring through the aggregation interface
  (``daisychain/peer/run/aggregator.py``, ``webui/run/aggregator.js``), never through a
  call site marked for it (issue 39).

Each check is tried on a planted fault, so that it is shown to catch one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "daisychain"
WEBUI = PKG / "webui"
MAX_LINES = 600
PRODUCT = {".py", ".js", ".mjs", ".wgsl", ".wat", ".html", ".css"}
JS_IMPORT = re.compile(r"""(?:^|;|\n)\s*(?:import|export)\b[^'"`;]*?\bfrom\s*["']([^"']+)["']"""
                       r"""|(?:^|;|\n)\s*import\s*["']([^"']+)["']"""
                       r"""|\bimport\(\s*["'`]([^"'`]+)["'`]\s*\)""")


def _is_module(dotted: str) -> bool:
    p = ROOT.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def python_imports(path: Path, text: str | None = None) -> set[str]:
    """The ``daisychain`` modules that ``path`` imports (dotted names)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    deps = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.split(".")[0] == "daisychain"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "daisychain":
                continue
            subs = [f"{name}.{a.name}" for a in node.names if _is_module(f"{name}.{a.name}")]
            deps.update(subs)
            if len(subs) < len(node.names):
                deps.add(name)
    return deps


def python_graph() -> dict[str, set[str]]:
    graph = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        graph[".".join(parts)] = python_imports(path)
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def js_imports(path: Path, text: str | None = None) -> set[str]:
    """The page's modules that ``path`` imports, relative to webui/."""
    deps = set()
    for m in JS_IMPORT.finditer(path.read_text() if text is None else text):
        spec = next(g for g in m.groups() if g)
        if spec.startswith("/webui/"):
            target = WEBUI / spec[len("/webui/"):]
        elif spec.startswith("."):
            target = (path.parent / spec).resolve()
        else:
            continue
        deps.add(target.relative_to(WEBUI).as_posix())
    return deps


def js_graph() -> dict[str, set[str]]:
    graph = {p.relative_to(WEBUI).as_posix(): js_imports(p)
             for p in WEBUI.rglob("*.js") if "node_modules" not in p.parts}
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _say(comps: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "; ".join(" <-> ".join(c) + " (" + ", ".join(
        f"{m} imports {sorted(graph[m] & set(c))}" for m in c) + ")" for c in comps)


def test_no_python_import_circle():
    graph = python_graph()
    assert "daisychain.engine.model" in graph and graph["daisychain.engine.model"]
    found = cycles(graph)
    assert not found, f"import circles in daisychain/: {_say(found, graph)}"


def test_no_js_import_circle():
    graph = js_graph()
    assert "shell/mesh.js" in graph and "run/index.js" in graph["shell/mesh.js"]
    found = cycles(graph)
    assert not found, f"import circles in daisychain/webui/: {_say(found, graph)}"


def test_the_circle_checks_catch_a_planted_circle():
    g = python_graph()
    g["daisychain.engine.spec"] = g["daisychain.engine.spec"] | python_imports(
        PKG / "engine" / "spec.py", "from daisychain.engine import model\n")
    assert any("daisychain.engine.spec" in c and "daisychain.engine.model" in c for c in cycles(g))
    j = js_graph()
    j["run/util.js"] = j["run/util.js"] | js_imports(WEBUI / "run" / "util.js",
                                                     'const m = await import("../shell/mesh.js");\n')
    assert any("run/util.js" in c and "shell/mesh.js" in c for c in cycles(j))


#: the JS folders' levels: a module imports only from its own level or below
JS_LEVELS = {"units": 0, "engine": 0, "wasm": 0, "wire": 1, "run": 2, "shell": 3, "page": 4}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    level = lambda m: JS_LEVELS.get(m.split("/")[0], -1) if "/" in m else -1
    return sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps if level(d) > level(m))


def test_js_folders_import_downward():
    graph = js_graph()
    loose = sorted(m for m in graph if "/" not in m or m.split("/")[0] not in JS_LEVELS)
    assert not loose, f"JS modules outside webui/'s folders {sorted(JS_LEVELS)}: {loose}"
    assert "units/gpu.js" in graph["engine/paths.js"]
    found = upward_imports(graph)
    assert not found, f"imports that go up a level (units/engine/wasm < wire < run < shell < page): {found}"
    planted = dict(graph)
    planted["engine/paths.js"] = graph["engine/paths.js"] | js_imports(
        WEBUI / "engine" / "paths.js", 'import { bus } from "../shell/bus.js";\n')
    assert "engine/paths.js imports shell/bus.js" in upward_imports(planted)


def product_files() -> list[Path]:
    return [p for p in PKG.rglob("*") if p.is_file() and p.suffix in PRODUCT
            and "node_modules" not in p.parts and "__pycache__" not in p.parts]


def test_no_product_file_over_600_lines():
    files = product_files()
    assert len(files) > 100
    long = sorted((len(p.read_text().splitlines()), p.relative_to(ROOT).as_posix()) for p in files
                  if len(p.read_text().splitlines()) > MAX_LINES)
    assert not long, f"product files over {MAX_LINES} lines (split them by role): {long}"


#: a call site marked for the ring (``# ring hook`` in Python, ``// ring hook`` in JS)
RING_HOOK = re.compile(r"ring hook", re.IGNORECASE)


def ring_hooks(texts: dict[str, str]) -> list[str]:
    """``path:line`` of every line of ``texts`` (path -> text) that names a ring hook."""
    return [f"{path}:{n}" for path, text in sorted(texts.items())
            for n, line in enumerate(text.splitlines(), 1) if RING_HOOK.search(line)]


def test_no_ring_hook_left():
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in product_files()}
    assert "daisychain/peer/run/aggregator.py" in texts and "daisychain/webui/run/aggregator.js" in texts
    found = ring_hooks(texts)
    assert not found, f"ring hooks left (call the aggregation interface instead): {found}"


def test_the_ring_hook_check_catches_a_planted_one():
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in product_files()}
    py, js = "daisychain/peer/run/member.py", "daisychain/webui/run/member.js"
    planted = dict(texts)
    planted[py] += "        self.ring.drop()  # ring hook\n"
    planted[js] += "    this.ring.drop(); // Ring hook: the coordinator's ring\n"
    assert ring_hooks(planted) == [f"{py}:{len(planted[py].splitlines())}",
                                   f"{js}:{len(planted[js].splitlines())}"]
