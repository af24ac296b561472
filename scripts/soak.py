"""The soak: every room test (tests/mesh and tests/browser_mesh, or the tests named) run N
times in a row, each round one pytest process inside the private network namespace, and
how many times each test passed, failed or was skipped, with its median and slowest
seconds. A flaky room test shows up as a failure count (issue 34, item 7):

    .venv/bin/python scripts/soak.py --count 30 --write          # the table in docs/RELIABILITY.md
    .venv/bin/python scripts/soak.py --count 50 tests/browser_mesh/test_ring_tab.py::test_a_tab_takes_part_in_a_ring
    .venv/bin/python scripts/soak.py --count 3 -k rollback         # a few rounds of some tests

Exit status 1 when any run of any test failed (or errored), so a soak can gate a merge. The
failures' first lines and the rounds they happened in are printed; each round's JUnit XML is
kept under --keep (default: a temporary folder), with the whole output of a round that failed
(roundNNN.log), to read the logs of a failed run."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "RELIABILITY.md"
BEGIN, END = "<!-- scripts/soak.py: begin -->", "<!-- scripts/soak.py: end -->"
ROOMS = ["tests/mesh", "tests/browser_mesh"]


def round_results(xml: Path) -> dict[str, tuple[str, float, str]]:
    """test id -> (outcome, seconds, first line of the failure) from one round's JUnit XML."""
    out = {}
    if not xml.exists():
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                text = (node.get("message") or node.text or "").strip().splitlines()[0:1]
                text = text[0][:200] if text else ""
                break
        out[name] = (outcome, float(case.get("time", 0.0)), text)
    return out


def soak(targets: list[str], count: int, keyword: str | None, keep: Path) -> tuple[dict, list, float]:
    runs: dict[str, list[tuple[str, float, str]]] = {}
    failures = []
    t0 = time.monotonic()
    for n in range(1, count + 1):
        xml = keep / f"round{n:03d}.xml"
        cmd = [str(ROOT / "scripts" / "in-netns.sh"), sys.executable, "-m", "pytest", "-q", "-p",
               "no:cacheprovider", f"--junitxml={xml}", *targets] + (["-k", keyword] if keyword else [])
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        got = round_results(xml)
        if res.returncode != 0:  # the whole round's output, to read a failure's logs later
            (keep / f"round{n:03d}.log").write_text(res.stdout + res.stderr)
        if not got:
            failures.append((n, "the round", (res.stdout + res.stderr).strip()[-300:]))
        for name, r in got.items():
            runs.setdefault(name, []).append(r)
            if r[0] in ("failed", "error"):
                failures.append((n, name, r[2]))
        bad = sum(1 for r in got.values() if r[0] in ("failed", "error"))
        print(f"round {n}/{count}: {len(got)} tests, {bad} failed ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    return runs, failures, time.monotonic() - t0


def table(runs: dict, failures: list, count: int, argv: list[str], wall: float) -> str:
    rows = ["| test | runs | passed | failed | skipped | median s | slowest s |",
            "|---|---|---|---|---|---|---|"]
    for name in sorted(runs):
        rs = runs[name]
        times = [t for o, t, _ in rs if o == "passed"] or [0.0]
        n = {k: sum(1 for o, _, _ in rs if o == k) for k in ("passed", "failed", "error", "skipped")}
        rows.append(f"| `{name}` | {len(rs)} | {n['passed']} | {n['failed'] + n['error']} | {n['skipped']} | "
                    f"{statistics.median(times):.1f} | {max(times):.1f} |")
    total = sum(len(r) for r in runs.values())
    bad = sum(1 for r in runs.values() for o, _, _ in r if o in ("failed", "error"))
    lines = [f"**{count} rounds, {len(runs)} tests, {total} runs, {bad} failed** ({wall / 60:.0f} min).", "",
             *rows, ""]
    if failures:
        lines += ["Failures (round: test: first line):", ""]
        lines += [f"- {n}: `{name}`: {text}" for n, name, text in failures[:40]]
        lines.append("")
    lines += [f"Command: `.venv/bin/python scripts/soak.py {' '.join(argv)}`",
              f"Machine: 2 cores (shared with other work while it ran), {date.today().isoformat()}."]
    return "\n".join(lines)


def put_section(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN in doc:
        head, rest = doc.split(BEGIN, 1)
        doc = head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + BEGIN + "\n" + text + "\n" + END + "\n"
    DOC.write_text(doc)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"test paths or ids (default: {' '.join(ROOMS)})")
    ap.add_argument("--count", type=int, default=30, help="rounds (default 30)")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression")
    ap.add_argument("--keep", type=Path, help="a folder for each round's JUnit XML")
    ap.add_argument("--write", action="store_true", help="write the table into docs/RELIABILITY.md")
    a = ap.parse_args(argv)
    if a.count < 1:
        ap.error("--count must be at least 1")
    keep = a.keep or Path(tempfile.mkdtemp(prefix="soak-"))
    keep.mkdir(parents=True, exist_ok=True)
    runs, failures, wall = soak(a.targets or ROOMS, a.count, a.keyword, keep)
    text = table(runs, failures, a.count, argv, wall)
    print(text)
    if a.write:
        put_section(text)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
