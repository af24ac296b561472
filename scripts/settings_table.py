"""Write docs/RELIABILITY.md's table of run settings: every number flag of ``train``,
``demo``, ``cluster``, ``daisy-peer`` and ``sample`` and every field of the page, the bad
values tried and the one line each gets, by running them:

    PYTHONPATH=. .venv/bin/python scripts/settings_table.py            # rewrites the table
    PYTHONPATH=. .venv/bin/python scripts/settings_table.py --no-write # prints it

Each command runs in this process (``daisychain.cli.main`` / ``daisy-peer``'s ``main``), so
nothing starts: a bad value stops it before any server, peer or process group. Every try must
exit 2 with exactly one line on stderr, or this script fails. The page's messages come from
``webui/engine/settings_check.js`` in node, fed the same raw texts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "RELIABILITY.md"
BEGIN, END = "<!-- scripts/settings_table.py: begin -->", "<!-- scripts/settings_table.py: end -->"
COMMANDS = ("train", "demo", "cluster", "daisy-peer", "sample")
PAGE_LABELS = {"steps": "steps", "seed": "the seed", "batch": "the batch",
               "micro_batch": "the micro-batch", "hidden": "hidden", "context": "the context", "lr": "the learning rate",
               "replicas": "replicas", "sync_every": "sync every", "outer_lr": "the outer learning rate",
               "outer_momentum": "the outer momentum"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from daisychain.cli import build_parser
    from daisychain.peer.cli import build_parser as peer_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = {c: sub.choices[c] for c in COMMANDS if c in sub.choices}
    out["daisy-peer"] = peer_parser()
    return out


def run(command: str, argv: list[str]) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of one command, in this process."""
    from daisychain.cli import main
    from daisychain.peer.cli import main as peer_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if command == "daisy-peer":
                code = peer_main(["--server", "http://127.0.0.1:9", *argv])
            elif command == "sample":
                code = main(["sample", "missing.pt", *argv])
            else:
                code = main([command, *argv])
        except SystemExit as exc:
            code = exc.code
    return int(code or 0), err.getvalue().strip().splitlines()


def bad_values(rng) -> list[str]:
    lo, hi = int(rng.lo) if rng.kind == "int" else rng.lo, int(rng.hi) if rng.kind == "int" else rng.hi
    if rng.kind == "int":
        return [str(lo - 1), str(hi + 1), "1.5", "ten"]
    out = ["inf", "nan", "1e300" if hi < 1e300 else "-1"]
    out.append(str(lo) if rng.lo_open else "-0.5")
    return out


def _one_line(command, argv):
    code, lines = run(command, argv)
    if code != 2 or len(lines) != 1:
        raise SystemExit(f"{command} {' '.join(argv)}: exit {code}, stderr {lines!r}: not one line "
                         f"and exit 2")
    return lines[0]


def _page(names_values: list[tuple[str, str]]) -> list[str]:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("node is needed for the page's column")
    mod = (ROOT / "daisychain" / "webui" / "engine/settings_check.js").as_uri()
    src = (f'import {{ checkSetting }} from "{mod}";\nimport {{ readFileSync }} from "node:fs";\n'
           'const cases = JSON.parse(readFileSync(0, "utf8"));\n'
           'console.log(JSON.stringify(cases.map(([n, v]) => checkSetting(n, v).error)));\n')
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "page.mjs"
        f.write_text(src)
        r = subprocess.run([node, str(f)], input=json.dumps(names_values), capture_output=True,
                           text=True, check=True)
    return json.loads(r.stdout)


def _cell(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def table() -> str:
    from daisychain.engine.settings import PAGE_SETTINGS, SETTINGS, flag

    parsers = _parsers()
    takes = {name: [c for c, p in parsers.items()
                    if any(getattr(a.type, "__name__", "") == name for a in p._actions)]
             for name in SETTINGS}
    rows = ["| setting | range | commands (and the page) | bad values tried | the one line each gets "
            "(exit 2; every command the same, `PROG: error: ...`) |", "|---|---|---|---|---|"]
    page_cases = [(n, v) for n in PAGE_SETTINGS for v in bad_values(SETTINGS[n])]
    page_msgs = dict(zip(page_cases, _page(page_cases)))
    for name, rng in SETTINGS.items():
        cmds = takes[name]
        if not cmds:
            raise SystemExit(f"{name}: no command takes it")
        values = bad_values(rng)
        msgs = []
        for v in values:
            lines = {c: _one_line(c, [flag(name), v]) for c in cmds}
            tails = {line.split(": error: ", 1)[1].rsplit(" (see ", 1)[0] for line in lines.values()}
            if len(tails) != 1:
                raise SystemExit(f"{flag(name)} {v}: the commands disagree: {lines}")
            msgs.append(tails.pop())
        where = ", ".join(f"`{c}`" for c in cmds)
        if name in PAGE_SETTINGS:
            where += ", page"
            for v in values:
                want = msgs[values.index(v)].removeprefix(flag(name) + " ")
                if page_msgs[(name, v)] != want:
                    raise SystemExit(f"page {name} {v!r}: {page_msgs[(name, v)]!r}, not {want!r}")
        rng_text = rng.text.split(" in ", 1)[1]
        rows.append(f"| `{flag(name)}` | {rng.kind} {rng_text} | {where} | "
                    + ", ".join(f"`{v}`" for v in values) + " | " + _cell(msgs[0]) + " |")
    rows += ["", "Other checks (`daisychain train`; `demo`, `cluster` and `daisy-peer` give the same line):",
             "", "| what | tried | the one line |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "empty.txt").write_bytes(b"")
        (t / "blob.txt").write_bytes(bytes(range(256)) * 4)
        (t / "short.txt").write_text("a short text of a hundred characters or so, " * 2)
        others = [
            ("task", ["--task", "nope"]),
            ("batch not a multiple of micro-batch", ["--batch", "60", "--micro-batch", "16"]),
            ("--layers", ["--layers", "64,x"]),
            ("--layers and --hidden", ["--layers", "64", "--hidden", "32"]),
            ("transformer: width and heads", ["--task", "text", "--layers", "block30h4"]),
            ("transformer: blocks of two widths", ["--task", "text", "--layers", "block16h2,block32h2"]),
            ("transformer: blocks on digits", ["--layers", "block16h2"]),
            ("transformer: context longer than the text", ["--task", "text", "--layers", "block16h2",
                                                           "--context", "256", "--data", str(t / "short.txt")]),
            ("transformer: too many parameters", ["--task", "text", "--layers", ",".join(["block1024h16"] * 16)]),
            ("transformer: too large a micro-batch", ["--task", "text", "--layers", "block16h2", "--context",
                                                      "256", "--micro-batch", "2048", "--batch", "2048"]),
            ("--data: missing file", ["--task", "text", "--data", "nonexistent.txt"]),
            ("--data: empty file", ["--task", "text", "--data", str(t / "empty.txt")]),
            ("--data: binary file", ["--task", "text", "--data", str(t / "blob.txt")]),
            ("--data: a folder", ["--task", "text", "--data", tmp]),
            ("--data with digits", ["--data", "x.txt"]),
            ("--float with --workers", ["--float", "--workers", "3"]),
            ("--save-every without --save-checkpoint", ["--save-every", "5"]),
            ("--resume: missing file", ["--resume", "missing.pt"]),
            ("an unknown flag", ["--frob"]),
            ("an unknown choice", ["--assign", "nope"]),
        ]
        rows_peer = [("--capacity (daisy-peer, cluster)", ["--capacity", "inf"])]
        for what, argv in rows_peer:
            line = _one_line("daisy-peer", argv)
            rows.append(f"| {what} | `{' '.join(argv)}` | {_cell(line)} |")
        for what, argv in others:
            line = _one_line("train", argv).replace(tmp, "DIR")
            shown = " ".join(a.replace(tmp, "DIR") for a in argv)
            rows.append(f"| {what} | `{shown}` | {_cell(line)} |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-write", action="store_true", help="print the table only")
    args = p.parse_args()
    text = table()
    if args.no_write:
        print(text)
        return 0
    doc = DOC.read_text()
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:a] + "\n" + text + "\n" + doc[b:])
    print(f"wrote the table to {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
