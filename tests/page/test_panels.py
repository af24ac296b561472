"""The page's panels are subscribers (docs/ARCHITECTURE.md, "The page"), read from the sources:

- the state changes only in the store's reducer (``page/panels/store.js`` ACTIONS, by
  ``dispatch``): no panel and not app.js assigns to ``state``, mutates one of its arrays or
  objects, or writes ``window.__daisy``;
- a panel (a module of ``page/panels/`` with a ``class ...Panel``) imports no other panel:
  what it draws after another one changed something comes as a bus event it subscribes to,
  never as a call of that panel's renderer; every panel subscribes to the bus itself;
- a panel commands the shells only by ``ui:*`` events (network.js, mesh.js subscribe to
  them): no method call on ``ctx.net`` or ``ctx.mesh`` but the two questions ``hasState()``
  and ``canRestore()``, and none on another panel's object (``ctx.tryPanel``, ``ctx.chart``);
- every ``ui:*`` command a panel emits has a subscriber in the shells.

Before this, app.js held every bus subscription and 39 state writes, the panels wrote the state
35 times, called each other's renderers and called the network and mesh directly. Each check
is tried on a planted fault, so that it is shown to catch one.
"""

from __future__ import annotations

import re
from pathlib import Path

from daisychain import package_path

PAGE = package_path("webui") / "page"
PANELS = PAGE / "panels"
SHELL = package_path("webui") / "shell"

WRITE = re.compile(
    r"""\bstate(?:\.\w+|\[[^\]\n]+\])+\s*(?:=(?!=)|\+=|-=|\*=|/=|\|\|=|&&=|\?\?=|\+\+|--)"""
    r"""|\bstate(?:\.\w+|\[[^\]\n]+\])+\.(?:push|pop|shift|unshift|splice|sort|reverse|fill)\("""
    r"""|\bObject\.assign\(\s*state\b|\bdelete\s+state\b|\bwindow\.__daisy(?:\.\w+)*\s*=(?!=)""")
IMPORT = re.compile(r"""\bfrom\s*["'](\./[\w.]+)["']""")
SHELL_CALL = re.compile(r"""\bctx\.(net|mesh)\??\.(\w+)\s*\(""")
PANEL_CALL = re.compile(r"""\bctx\.(tryPanel|chart)\??\.(\w+)\s*\(""")
QUESTIONS = {"hasState", "canRestore"}
UI_EMIT = re.compile(r"""bus\.(?:emit|request)\(\s*["'](ui:[\w-]+)["']""")
UI_ON = re.compile(r"""bus\.on\(\s*["'](ui:[\w-]+)["']""")


def _code(text: str) -> str:
    """The text without its // and /* */ comments (a comment may quote a write)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"(?m)(^|[^:\"'`\\])//.*$", r"\1", text)


def store_writes(name: str, text: str) -> list[str]:
    return [f"{name}: {m.group(0)}" for m in WRITE.finditer(_code(text))]


def is_panel(text: str) -> bool:
    return re.search(r"\bclass\s+\w+Panel\b", text) is not None


def panel_imports(name: str, text: str, panels: set[str]) -> list[str]:
    return [f"{name} imports {m.group(1)}" for m in IMPORT.finditer(_code(text))
            if m.group(1)[2:] in panels and m.group(1)[2:] != name]


def shell_calls(name: str, text: str) -> list[str]:
    code = _code(text)
    return ([f"{name}: ctx.{m.group(1)}.{m.group(2)}()" for m in SHELL_CALL.finditer(code)
             if m.group(2) not in QUESTIONS]
            + [f"{name}: ctx.{m.group(1)}.{m.group(2)}()" for m in PANEL_CALL.finditer(code)])


def _sources() -> dict[str, str]:
    out = {p.name: p.read_text() for p in sorted(PANELS.glob("*.js"))}
    assert {"store.js", "room.js", "settings.js", "run.js", "end.js"} <= set(out)
    return out


def _panels(src: dict[str, str]) -> set[str]:
    return {n for n, t in src.items() if is_panel(t)}


def test_only_the_store_changes_the_state():
    src = _sources()
    found = [w for n, t in src.items() if n != "store.js" for w in store_writes(n, t)]
    found += store_writes("app.js", (PAGE / "app.js").read_text())
    assert not found, f"state written outside the store's reducer (dispatch an action): {found}"
    assert "export function dispatch" in src["store.js"] and "ACTIONS" in src["store.js"]


def test_panels_subscribe_and_import_no_other_panel():
    src = _sources()
    panels = _panels(src)
    assert {"events.js", "device.js", "room.js", "peers.js", "settings.js", "run.js", "end.js",
            "chart_panel.js", "gallery.js", "model_data.js", "try.js"} <= panels
    found = [i for n in sorted(panels) for i in panel_imports(n, src[n], panels)]
    assert not found, f"a panel imports another panel (subscribe to a bus event instead): {found}"
    silent = [n for n in sorted(panels) if "bus.on(" not in src[n]]
    assert not silent, f"panels that subscribe to nothing: {silent}"
    app = (PAGE / "app.js").read_text()
    assert "bus.on(" not in _code(app), "app.js subscribes to the bus: the panels do"


def test_panels_command_the_shells_by_ui_events():
    src = _sources()
    found = [c for n, t in src.items() for c in shell_calls(n, t)]
    assert not found, f"a panel calls the network, the mesh or another panel (emit a ui:* or page:* event): {found}"
    emitted = {m.group(1) for t in src.values() for m in UI_EMIT.finditer(t)}
    handled = {m.group(1) for p in SHELL.glob("*.js") for m in UI_ON.finditer(p.read_text())}
    assert {"ui:join", "ui:approve", "ui:start", "ui:stop"} <= emitted
    assert emitted <= handled, f"ui:* commands nobody in shell/ handles: {sorted(emitted - handled)}"
    documented = set(re.findall(r"ui:[\w-]+", (SHELL / "bus.js").read_text()))
    assert handled <= documented, f"ui:* commands bus.js does not list: {sorted(handled - documented)}"


def test_the_checks_catch_planted_faults():
    src = _sources()
    panels = _panels(src)
    room = src["room.js"]
    assert store_writes("room.js", room + "\nstate.room = null;\n")
    assert store_writes("room.js", room + "\n  state.share.links.push(x);\n")
    assert store_writes("room.js", room + "\nObject.assign(state.run, s);\n")
    assert not store_writes("room.js", room + "\n// state.room = null (a comment)\nif (state.room === x) f();\n")
    assert panel_imports("run.js", src["run.js"] + '\nimport { renderPeers } from "./peers.js";\n', panels)
    assert not panel_imports("run.js", src["run.js"] + '\nimport { x } from "./store.js";\n', panels)
    assert shell_calls("room.js", room + "\nctx.net.approve(id);\n")
    assert shell_calls("end.js", src["end.js"] + "\nawait ctx.mesh?.snapshot();\n")
    assert shell_calls("end.js", src["end.js"] + "\nctx.tryPanel.use(tr, label);\n")
    assert not shell_calls("end.js", "ctx.mesh?.hasState();\n")
