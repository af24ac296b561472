"""One table of task defaults (issue 33 item 1, issue 36 item 3): engine/task_defaults.json,
read by every command (settings_from_args), the page and /selftest (the generated
webui/engine/task_defaults.js). Before it, the image defaults lived in settings.py and again in
spec.js, and /selftest?task=image trained lr 0.003 without the recipe."""

from __future__ import annotations

import argparse
import json

from jsrun import run_js

from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.task_defaults import JS_PATH, TASK_DEFAULTS, defaults, js_module


def test_the_js_table_is_generated_from_the_json():
    assert JS_PATH.read_text(encoding="utf-8") == js_module(), \
        "run: python -m daisychain.engine.task_defaults"


def test_js_and_python_resolve_the_table_alike():
    cases = [(t, s) for t in TASK_DEFAULTS for s in (None, 1, 5, 9, 10, 999, 1000, 3000, 10**7)]
    got = run_js("console.log(JSON.stringify(DATA.map(([t, s]) => T.taskDefaults(t, s))));",
                 imports={"T": "engine/task_defaults.js"}, data=cases)
    assert got == [defaults(t, s) for t, s in cases]


def _run(argv):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(argv))


def test_every_command_takes_the_task_defaults_from_the_table():
    for task in ("digits", "image"):
        d = defaults(task)
        rs = _run(["--task", task])
        assert rs.steps == d["steps"]
        assert (rs.hp.lr, rs.hp.augment_shift, rs.hp.lr_warmup, rs.hp.lr_decay_steps) == \
            (d["lr"], d["augment_shift"], d["lr_warmup"], d["lr_decay_steps"])
    img = defaults("image")
    assert (img["steps"], img["lr"]) == (3000, 0.006)
    rs = _run(["--task", "image", "--steps", "50"])  # the warm-up is at most a tenth of the steps
    assert (rs.hp.lr_warmup, rs.hp.lr_decay_steps) == (5, 50)
