"""scripts/move_webui.py (the JS tree in the Python packages' folders) has nothing left to do:
no JS file at an old place and no specifier, URL or test path that names one. A branch merged
after the move that still says ``../gemm.js`` or ``imports={"W": "frames.js"}`` fails here
until the script runs again (it is re-runnable). The check is tried on a planted old import.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "move_webui.py"


def _script():
    spec = importlib.util.spec_from_file_location("move_webui", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_nothing_left_to_move_or_rewrite():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"run python scripts/move_webui.py: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"


def test_an_old_specifier_is_pointed_at_the_new_place():
    mv = _script()
    fm = mv.file_map()
    assert fm["gemm.js"] == "units/gemm.js" and fm["panels/store.js"] == "page/panels/store.js"
    planted = 'import { MAX_K } from "../gemm.js";\nconst b = await import("../shell/bus.js");\n'
    got = mv.rewrite_js(planted, "engine/paths.js", "engine/paths.js", fm)
    assert '"../units/gemm.js"' in got and '"../shell/bus.js"' in got
    moved = mv.rewrite_js('import { x } from "./engine/spec.js";\n', "shell/mesh.js", "mesh.js", fm)
    assert '"../engine/spec.js"' in moved
    py = mv.rewrite_paths('run_js(b, imports={"W": "frames.js"})\nstore_writes("app.js", t)\n', fm, ".py", True)
    assert '"W": "wire/frames.js"' in py and 'store_writes("app.js"' in py
