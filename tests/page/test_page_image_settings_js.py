"""Unit tier (node): what the page builds from an image run's settings and identity, against
Python's settings (engine/settings.py settings_from_args, checkpoint.py run_flags):

- spec.js recipeSettings (what mesh.start gives an image run without recipe fields) is
  settings_from_args's recipe: shift 2, warm-up min(100, steps / 10), decay at --steps;
- ui_format.js trainCommand (the end card's `daisychain train ...`) remakes the run's
  identity: it used to build --layers from linear widths only (a CNN's command named no
  convolution, or --hidden of its last dense layer) and left out the recipe flags;
- checkpoint.js settingsOf (a loaded checkpoint's form settings) gives the --layers items of
  a CNN (it used to give its dense widths only) and the recipe."""

from __future__ import annotations

import argparse
import shlex

from daisychain.engine.data import model_for
from daisychain.engine.settings import add_run_arguments, parse_layers, settings_from_args
from daisychain.engine.spec import Hyper, SpecError
from daisychain.engine.trainer import run_identity
from daisychain.units import load_luts
from jsrun import run_js

DRIVER = r"""
const job = DATA;
const recipes = job.recipes.map(([task, steps, given]) => {
  try { return S.recipeSettings(task, steps, given); } catch (e) { return `${e.name}: ${e.message}`; }
});
const commands = job.identities.map((id) => F.trainCommand(id, job.data_args, 7));
const settings = job.identities.map((id) => C.settingsOf(id));
console.log(JSON.stringify({ recipes, commands, settings }));
"""

IMAGE = ["--task", "image", "--image-size", "8"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p


def settings(*argv: str):
    return settings_from_args(parser().parse_args(list(argv)))


def run_node(node, tmp_path, job) -> dict:
    return run_js(DRIVER, imports={"S": "engine/spec.js", "F": "page/ui_format.js", "C": "engine/checkpoint.js"},
                  data=job, timeout=120)


RECIPE_CASES = [  # (task, steps, given) -> the recipe fields settings_from_args makes
    ("image", 4, {}), ("image", 3000, {}), ("image", 250, {"augment_shift": None}),
    ("image", 50, {"augment_shift": 0}), ("image", 60, {"lr_warmup": 7, "lr_decay_steps": 40}),
    ("digits", 600, {}), ("digits", 600, {"lr_warmup": 3, "lr_decay_steps": 9}), ("text", 5, {"augment_shift": 1}),
]

IMAGE_RUNS = [  # --layers / --hidden and recipe flags of image runs whose identity the page shows
    ["--layers", "conv4,pool,16", "--steps", "4"],
    ["--layers", "conv4k5,pool,conv6,pool", "--steps", "30", "--augment-shift", "0", "--lr-warmup", "0",
     "--lr-decay-steps", "0"],
    ["--hidden", "24", "--steps", "9", "--lr-warmup", "2", "--lr-decay-steps", "20", "--weight-decay", "0.01"],
    ["--steps", "12", "--augment-shift", "1"],
    ["--hidden", "8", "--steps", "5", "--replicas", "3", "--sync-every", "2", "--outer-lr", "0.7",
     "--outer-momentum", "0.9"],  # local steps: the command and the settings carry them
    ["--hidden", "8", "--steps", "5", "--replicas", "2", "--moments-every", "3"],  # and a K not the default
]


def test_page_recipe_command_and_settings_of_image_runs_match_python(tmp_path, node):
    luts = load_luts()
    identities, runs = [], []
    for argv in IMAGE_RUNS:
        rs = settings(*IMAGE, "--seed", "4", *argv)
        runs.append(rs)
        identities.append(run_identity(rs.spec, rs.hp, rs.ds, luts))
    got = run_node(node, tmp_path, {"recipes": RECIPE_CASES, "identities": identities, "data_args": IMAGE})

    for (task, steps, given), have in zip(RECIPE_CASES, got["recipes"]):
        flags = [w for k, v in given.items() if v is not None for w in (f"--{k.replace('_', '-')}", str(v))]
        try:
            hp = settings("--task", task, "--steps", str(steps), *(["--image-size", "8"] if task == "image" else []),
                          *flags).hp
        except SpecError as e:
            assert have == f"SpecError: {e}"
            continue
        assert have == {"augment_shift": hp.augment_shift, "lr_warmup": hp.lr_warmup,
                        "lr_decay_steps": hp.lr_decay_steps}, (task, steps, given)

    for ident, rs, cmd, st in zip(identities, runs, got["commands"], got["settings"]):
        words = shlex.split(cmd)
        assert words[:2] == ["daisychain", "train"]
        again = settings(*words[2:])
        # the command's run is this run, but for --steps (the step reached): the recipe flags
        # are explicit, so the schedule does not follow the new --steps
        assert run_identity(again.spec, again.hp, again.ds, luts) == ident, cmd
        assert again.steps == 7
        for k in ("augment_shift", "lr_warmup", "lr_decay_steps"):
            assert st[k] == getattr(rs.hp, k)
        for k in ("replicas", "sync_every", "outer_lr", "outer_momentum", "moments_every"):
            assert st.get(k, getattr(Hyper(), k)) == getattr(rs.hp, k)
        assert model_for(rs.ds, parse_layers(",".join(map(str, st["layers"])))).to_json() == ident["model"]
        dense = all(isinstance(t, int) for t in st["layers"])
        assert st["hidden"] == (st["layers"][0] if dense else None)
        assert (st["seed"], st["batch"], st["micro_batch"], st["lr"]) == (4, rs.hp.batch, rs.hp.micro_batch, rs.hp.lr)

