"""Run a JS module snippet in node and return what it prints, as JSON: the one driver of the JS
mirror tests (instead of a node driver string and a ``subprocess.run`` in every test file).

    got = run_js('console.log(JSON.stringify(L.parseLinks(DATA.payload, "a", ["a", "b"])));',
                 imports={"L": "wire/links.js"}, data={"payload": {...}})

``imports`` maps a name to a module: ``{"L": "wire/links.js"}`` is ``import * as L from ...`` and
``{"{ choosePath }": "units/gpu.js"}`` is ``import { choosePath } from ...``; a relative path is
under ``daisychain/webui/`` (a Path or an absolute path is taken as it is). ``data`` goes to
node as JSON on stdin and is the snippet's ``DATA`` (null without it). Every snippet may use
``readFileSync`` (node:fs) and ``WEBUI`` (the webui folder's file URL, ending in ``/``).

Without node the test FAILS (never skips): a run that did not run the JS side must not look
green. A snippet that exits non-zero fails the test with node's stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from daisychain import package_path

NODE_MISSING = ("node is not installed: the JS mirror tests need it (scripts/setup.sh installs "
                "Debian's nodejs)")


#: JS that reads the unit tables from the folder ``lutDir`` (a name the snippet defines, e.g.
#: from ``process.argv``) into ``luts``, as engine/cpu_units.js CpuUnits takes them
LOAD_LUTS = r"""
const rd = (n) => { const b = readFileSync(`${lutDir}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
const manifest = JSON.parse(readFileSync(`${lutDir}/manifest.json`));
const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"), exp: rd("exp"),
  manifestSha256: manifest.manifest_sha256, expSha256: manifest.extra_units.exp.sha256 };
"""


def node_binary() -> str:
    """The node binary, or the test fails saying node is missing."""
    path = shutil.which("node")
    if path is None:
        pytest.fail(NODE_MISSING, pytrace=False)
    return path


def module_url(module: str | Path) -> str:
    """The file URL of ``module`` (relative: under daisychain/webui)."""
    path = Path(module)
    if not path.is_absolute():
        path = package_path("webui") / path
    return path.resolve().as_uri()


def js_source(body: str, imports: dict[str, str | Path] | None = None) -> str:
    """The whole module node runs: the imports, DATA, WEBUI, then ``body``."""
    lines = ['import { readFileSync } from "node:fs";']
    for name, module in (imports or {}).items():
        what = name if name.lstrip().startswith("{") else f"* as {name}"
        lines.append(f"import {what} from {json.dumps(module_url(module))};")
    lines.append('const DATA = process.env.JSRUN_DATA === "1" ? JSON.parse(readFileSync(0, "utf8")) : null;')
    lines.append(f"const WEBUI = {json.dumps(package_path('webui').resolve().as_uri() + '/')};")
    return "\n".join(lines) + "\n" + body + "\n"


def run_node(body: str, imports: dict[str, str | Path] | None = None, data: Any = None,
             timeout: float = 60, args: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the snippet; the finished process (whatever its exit status)."""
    node = node_binary()
    with tempfile.TemporaryDirectory(prefix="jsrun-") as tmp:
        script = Path(tmp) / "snippet.mjs"
        script.write_text(js_source(body, imports))
        env = {**os.environ, "JSRUN_DATA": "1" if data is not None else "0"}
        return subprocess.run([node, str(script), *(args or [])], capture_output=True, text=True,
                              timeout=timeout, env=env,
                              input=json.dumps(data) if data is not None else "")


def run_js(body: str, imports: dict[str, str | Path] | None = None, data: Any = None,
           timeout: float = 60, args: list[str] | None = None) -> Any:
    """Run the snippet in node and return its stdout parsed as JSON (the snippet prints one JSON
    document, last: what the modules log before it is passed over); a non-zero exit fails the
    test with node's stderr."""
    proc = run_node(body, imports, data, timeout, args)
    if proc.returncode != 0:
        pytest.fail(f"node exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    lines = proc.stdout.strip().splitlines()
    for text in (proc.stdout, lines[-1] if lines else ""):  # the whole output, or its last line
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    pytest.fail(f"node printed no JSON document:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}",
                pytrace=False)
