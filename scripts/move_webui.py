#!/usr/bin/env python3
"""Move the page's JS files into folders that mirror the Python packages, and rewrite every
path that names a moved file: ``python scripts/move_webui.py [--check] [--all-mentions]``.

``daisychain/webui/`` becomes ``units/`` (the INT8 units, their tables, the GPU), ``wire/``
(signaling messages, data-channel frames, links), ``engine/`` (the engine's twins, already a
folder), ``run/`` (the run roles, already a folder), ``shell/`` (the socket, the data channels,
the compute workers, the bus) and ``page/`` (the page and its panels). ``wasm/``, index.html,
selftest.html and style.css stay where the server serves them.

The table MOVES is the whole change. The script is re-runnable on any tree (a merge of
branches that edited the old files included): a file still at its old place is moved
(``git mv``), and every specifier that resolves to an old place is pointed at the new one.
What it rewrites, and nothing else:

- in the JS and HTML under ``webui/``: static ``import``/``export ... from``, side-effect
  ``import "..."``, dynamic ``import(...)`` (a JSDoc ``import("./bus.js").Bus`` too),
  ``new URL("...", import.meta.url)``, ``new Worker("...")``, ``importScripts("...")``;
  a relative specifier that no longer resolves from the file's place is resolved from the
  file's old place (the table backwards), so an import that a merged branch added to a
  moved file lands right;
- anywhere in the repository: ``webui/<old path>`` (``/webui/...`` URLs in tests, benches,
  script tags; ``daisychain/webui/...``; ``${input.webui}/...``), a Python string literal
  that is exactly an old path relative to webui/ (``run_js(imports={"W": "frames.js"})``,
  ``WEBUI / "settings_table.js"``; not a path under another folder), ``new URL("<old>",
  WEBUI)`` in node scripts;
- path mentions (``webui/<old path>`` in comments and docs) are left alone in the files that
  other work owns this stop (PROTECTED: their specifiers still change); ``--all-mentions``
  rewrites those too. JSON files (test data, golden files) are never touched.

``--check`` changes nothing and exits 1 if anything is left to move or rewrite.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEBUI = ROOT / "daisychain" / "webui"

#: old path -> new path, relative to webui/; a trailing "/" moves a folder's files
MOVES = {
    # units/: the INT8 units in JS, their tables, and the WGSL units behind gpu.js
    "units.js": "units/units.js",
    "gemm.js": "units/gemm.js",
    "conv.js": "units/conv.js",
    "luts.js": "units/luts.js",
    "sha256.js": "units/sha256.js",
    "gpu.js": "units/gpu.js",
    "gpu_error.js": "units/gpu_error.js",
    "gpu_plan.js": "units/gpu_plan.js",
    "gpu_resident.js": "units/gpu_resident.js",
    # wire/: signaling messages (signaling.py), data-channel frames (peer/frames.py ...)
    "protocol.js": "wire/protocol.js",
    "frames.js": "wire/frames.js",
    "framing.js": "wire/framing.js",
    "intcodec.js": "wire/intcodec.js",
    "messages.js": "wire/messages.js",
    "links.js": "wire/links.js",
    # engine/: the twins of engine/checkpoint.py, counters.py, settings.py
    "checkpoint.js": "engine/checkpoint.js",
    "counters.js": "engine/counters.js",
    "settings_check.js": "engine/settings_check.js",
    "settings_table.js": "engine/settings_table.js",
    # shell/: what moves bytes and keeps time (peer/node.py, rtc.py, client.py)
    "mesh.js": "shell/mesh.js",
    "network.js": "shell/network.js",
    "run_start.js": "shell/run_start.js",
    "run_speed.js": "shell/run_speed.js",
    "room_view.js": "shell/room_view.js",
    "device.js": "shell/device.js",
    "uploads.js": "shell/uploads.js",
    "bus.js": "shell/bus.js",
    "worker/": "shell/worker/",
    # page/: the page, the self-test page's script, the panels
    "app.js": "page/app.js",
    "chart.js": "page/chart.js",
    "ui_format.js": "page/ui_format.js",
    "selftest.js": "page/selftest.js",
    "panels/": "page/panels/",
}

#: files whose contents other work owns this stop: only their specifiers change
PROTECTED = ("daisychain/webui/run/", "daisychain/webui/engine/", "daisychain/webui/wasm/",
             "daisychain/shaders/", "daisychain/webui/units/gpu", "daisychain/webui/gpu")

TEXT = {".py", ".js", ".mjs", ".md", ".html", ".sh", ".wgsl", ".wat", ".toml", ".txt", ".css",
        ".cfg", ".yml", ".yaml"}
SKIP_DIRS = {".git", "node_modules", ".venv", "__pycache__", "golden", "luts", ".pytest_cache"}
SELF = Path(__file__).resolve()
#: files that quote old paths on purpose (this script's test plants them)
KEEP = {SELF, ROOT / "tests" / "test_move_webui.py"}

SPEC = r"""(?P<q>["'`])(?P<s>(?:\.{1,2}/|/webui/)[^"'`\s]*?)(?P=q)"""
JS_SPECIFIERS = re.compile(
    r"\bfrom\s*" + SPEC                                   # import/export ... from "x"
    + r"|(?:^|[;\n])\s*import\s*" + SPEC.replace("?P<q>", "?P<q2>").replace("?P<s>", "?P<s2>")
    .replace("(?P=q)", "(?P=q2)")                         # import "x"
    + r"|\b(?:import|importScripts|new\s+Worker|new\s+SharedWorker)\s*\(\s*"
    + SPEC.replace("?P<q>", "?P<q3>").replace("?P<s>", "?P<s3>").replace("(?P=q)", "(?P=q3)")
    + r"|\bnew\s+URL\(\s*" + SPEC.replace("?P<q>", "?P<q4>").replace("?P<s>", "?P<s4>")
    .replace("(?P=q)", "(?P=q4)") + r"(?=\s*,\s*import\.meta\.url)")


def file_map() -> dict[str, str]:
    """Every file's old path -> new path (folders expanded from what is on disk at either
    place); no new path is an old one, so a second run cannot move anything twice."""
    out = {}
    for old, new in MOVES.items():
        if not old.endswith("/"):
            out[old] = new
            continue
        for base, other, flip in ((old, new, False), (new, old, True)):
            folder = WEBUI / base
            for p in sorted(folder.rglob("*")) if folder.is_dir() else []:
                if p.is_file() and "node_modules" not in p.parts:
                    rel = p.relative_to(folder).as_posix()
                    out[other + rel if flip else base + rel] = (base + rel) if flip else other + rel
    assert not set(out.values()) & set(out), "a new path is an old one"
    return out


def move(fm: dict[str, str], check: bool) -> list[str]:
    """git mv every file still at its old place; the list of what moved (or would)."""
    done, clash = [], []
    for old, new in sorted(fm.items()):
        src, dst = WEBUI / old, WEBUI / new
        if not src.exists():
            continue
        if dst.exists():
            clash.append(f"{old} and {new}")
            continue
        done.append(f"{old} -> {new}")
        if check:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(src)], cwd=ROOT,
                                 capture_output=True).returncode == 0
        if tracked:
            subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)
        else:
            src.rename(dst)
    if clash:
        sys.exit("move_webui: both the old and the new file exist (merge them by hand, then "
                 "run again): " + "; ".join(clash))
    if not check:
        for old in MOVES:
            folder = WEBUI / old
            if old.endswith("/") and folder.is_dir() and not any(folder.rglob("*")):
                folder.rmdir()
    return done


def _exists(rel: str) -> bool:
    return (WEBUI / rel).is_file()


def resolve(spec: str, here: str, was: str, fm: dict[str, str]) -> str:
    """The specifier ``spec`` of the file now at ``here`` (once at ``was``; both relative to
    webui/), pointed at its target's new place; unchanged when it resolves already."""
    if spec.startswith("/webui/"):
        target = spec[len("/webui/"):]
        path, _, tail = target.partition("?")
        new = fm.get(posixpath.normpath(path))
        return "/webui/" + new + (("?" + tail) if tail else "") if new else spec
    path, sep, tail = spec.partition("?")
    now = posixpath.normpath(posixpath.join(posixpath.dirname(here), path))
    if now.startswith("../") or _exists(now):
        return spec
    old = posixpath.normpath(posixpath.join(posixpath.dirname(was), path))
    new = fm.get(old, old if _exists(old) else None)
    if new is None:
        return spec
    rel = posixpath.relpath(new, posixpath.dirname(here) or ".")
    if not rel.startswith("../"):
        rel = "./" + rel
    return rel + sep + tail


def rewrite_js(text: str, here: str, was: str, fm: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        for g in ("s", "s2", "s3", "s4"):
            if m.group(g) is not None:
                s, e = m.span(g)
                new = resolve(m.group(g), here, was, fm)
                a = m.start()
                return m.group(0)[:s - a] + new + m.group(0)[e - a:]
        return m.group(0)
    return JS_SPECIFIERS.sub(sub, text)


def _alternation(fm: dict[str, str]) -> str:
    olds = sorted(set(fm) | {o.rstrip("/") for o in MOVES if o.endswith("/")}, key=len, reverse=True)
    return "|".join(re.escape(o) for o in olds)


def _target(old: str, fm: dict[str, str]) -> str:
    return fm.get(old) or MOVES[old + "/"].rstrip("/")


def rewrite_paths(text: str, fm: dict[str, str], suffix: str, mentions: bool) -> str:
    """``webui/<old>`` (URLs, script tags, mentions), Python literals that are exactly an old
    path, ``new URL("<old>", WEBUI)``."""
    alt = _alternation(fm)
    if mentions:
        text = re.sub(r"(?<![\w-])(webui\}?/)(" + alt + r")(?![\w-])",
                      lambda m: m.group(1) + _target(m.group(2), fm), text)
    else:  # only URL specifiers /webui/<old> inside a string (what a browser loads)
        text = re.sub(r"""(?<=["'`(])(/webui/)(""" + alt + r")(?![\w-])",
                      lambda m: m.group(1) + _target(m.group(2), fm), text)
    olds = "|".join(re.escape(o) for o in sorted(fm, key=len, reverse=True))
    if suffix in (".js", ".mjs"):
        text = re.sub(r"""(new\s+URL\(\s*)(["'])(""" + olds + r")\2(?=\s*,\s*WEBUI\b)",
                      lambda m: m.group(1) + m.group(2) + fm[m.group(3)] + m.group(2), text)
    if suffix == ".py":
        def lit(m: re.Match) -> str:
            before = text[max(0, m.start() - 80):m.start()]
            join = re.search(r"""(\S+)\s*/\s*$""", before)
            named = (join and "webui" in join.group(1).lower()  # WEBUI / "x.js"
                     or re.search(r"""(?::|\[)\s*$""", before)  # {"W": "x.js"}, graph["x.js"]
                     or re.match(r"""\s+in\b""", text[m.end():m.end() + 8]))  # "x.js" in graph
            if not named:
                return m.group(0)  # a name that is no path under webui/ (a test's own tree, a label)
            return m.group(1) + fm[m.group(2)] + m.group(1)
        text = re.sub(r"""(["'])(""" + olds + r")\1", lit, text)
    return text


def repo_files() -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")
                       and not d.endswith(".egg-info")]
        out += [Path(dirpath) / f for f in filenames if Path(f).suffix in TEXT]
    return sorted(p for p in out if p.resolve() not in KEEP)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is left to do")
    ap.add_argument("--all-mentions", action="store_true",
                    help="also rewrite path mentions in the files other work owns (PROTECTED)")
    args = ap.parse_args(argv)
    fm = file_map()
    moved = move(fm, args.check)
    for line in moved:
        print(("would move " if args.check else "moved ") + line)
    if args.check and moved:
        return 1
    back = {new: old for old, new in fm.items()}
    changed = []
    for path in repo_files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        new = text
        if path.is_relative_to(WEBUI) and path.suffix in (".js", ".mjs", ".html"):
            here = path.relative_to(WEBUI).as_posix()
            new = rewrite_js(new, here, back.get(here, here), fm)
        mentions = args.all_mentions or not rel.startswith(PROTECTED)
        new = rewrite_paths(new, fm, path.suffix, mentions)
        if new != text:
            changed.append(rel)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for rel in changed:
        print(("would rewrite " if args.check else "rewrote ") + rel)
    if not moved and not changed:
        print("move_webui: nothing to do")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
