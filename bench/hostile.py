"""What a hostile member costs a room (issue 35): the same room of real ``daisy-peer``
processes (a host, an honest member, and ``tests/hostile/attacker.py``, a daisy-peer that
turns hostile after step 3) trains the same run once per attack, interleaved with rooms where
the third member stays honest (the baseline). Per room: the host's committed steps per
second (``steps_per_s`` of ``daisy-peer --json``), its slowest step, whether the honest two end
on ``daisychain train``'s hash, and the peak RSS growth of the honest two. Run it in the
private namespace:

    ./scripts/in-netns.sh .venv/bin/python -m bench.hostile            # writes docs/SECURITY.md
    ./scripts/in-netns.sh .venv/bin/python -m bench.hostile --attacks sync-flood --no-write

Against an older checkout (the attacks' "before"): ``PYTHONPATH=<old checkout>`` with
``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from tqdm import tqdm

from bench._proc import wait_for_log
from bench.chaos import Server, put_section, reference_for

ROOT = Path(__file__).resolve().parents[1]
ATTACKER = ROOT / "tests" / "hostile" / "attacker.py"
DOC = ROOT / "docs" / "SECURITY.md"
BEGIN, END = "<!-- bench/hostile.py: begin -->", "<!-- bench/hostile.py: end -->"
ALL = ["forged-run", "sync-flood", "unasked-state", "min-int64", "segment-bomb", "frame-flood",
       "big-frame"]


class Peak:
    """Peak RSS growth of some processes, sampled every 20 ms."""

    def __init__(self, procs: dict):
        self.ps, self.base = {}, {}
        for n, p in procs.items():
            try:
                self.ps[n] = psutil.Process(p.pid)
                self.base[n] = self.ps[n].memory_info().rss
            except psutil.Error:  # already gone
                self.ps.pop(n, None)
        self.peak = dict(self.base)
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop.wait(0.02):
            for n, p in self.ps.items():
                try:
                    self.peak[n] = max(self.peak[n], p.memory_info().rss)
                except psutil.Error:
                    pass

    def growth_mb(self) -> float:
        self.stop.set()
        self.t.join(5)
        return max((self.peak[n] - self.base[n] for n in self.ps), default=0) / 2**20


class Proc:
    """A real process with its stderr in a file (to wait on) and its stdout kept."""

    def __init__(self, cmd: list[str], err: Path, env: dict | None = None):
        self.err_path = err
        self.err = open(err, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     cwd=ROOT, env=env)

    def wait_for(self, pattern: str, timeout: float):
        return wait_for_log(self.proc, lambda: self.err_path.read_text(errors="replace"), pattern,
                            timeout)

    def summary(self, timeout: float) -> dict | None:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if self.proc.returncode == 0 and lines else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.err.close()


def room(url: str, attack: str, run: list[str], tmp: Path, n: int) -> dict:
    peer = [str(Path(sys.executable).parent / "daisy-peer"), "--server", url, "--loopback",
            "--capacity", "50", "--json"]
    host = Proc([*peer, "--name", f"h{n}", "--create-room", "--approve", "all", "--wait-peers", "2",
                 *run], tmp / f"h{n}.err")
    made = [host]
    try:
        code = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})", 120).group(1)
        m1 = Proc([*peer, "--name", f"m{n}", "--room", code], tmp / f"m{n}.err")
        env = {**os.environ, "DAISY_ATTACKS": "" if attack == "none" else attack,
               "DAISY_ATTACK_FROM": "3"}
        bad = Proc([sys.executable, str(ATTACKER), "--server", url, "--room", code, "--loopback",
                    "--name", f"mallory{n}", "--capacity", "50"], tmp / f"a{n}.err", env)
        made += [m1, bad]
        bad.wait_for("joined run", 120)  # (the --json peers log no progress)
        peak = Peak({"host": host.proc, "m1": m1.proc})
        res = [p.summary(600) for p in (host, m1)]
        growth = peak.growth_mb()
        want = reference_for(run)
        return {"attack": attack, "ok": all(r and r["params_sha256"] == want for r in res),
                "steps_per_s": res[0]["steps_per_s"] if res[0] else None,
                "slowest_step_s": res[0].get("slowest_step_s") if res[0] else None,
                "growth_mb": growth}
    finally:
        for p in made:
            p.kill()


def table(rows: list[dict]) -> str:
    base = sorted(r["steps_per_s"] for r in rows if r["attack"] == "none" and r["steps_per_s"])
    b = base[len(base) // 2] if base else float("nan")
    out = ["| attack | honest peers on train's hash | host steps/s (vs no attack) | slowest step (s) | peak RSS growth (MB) |",
           "|---|---|---|---|---|"]
    for r in rows:
        sps = r["steps_per_s"]
        ratio = f"{sps:.1f} ({sps / b:.2f}x)" if sps else "-"
        slow = f"{r['slowest_step_s']:.2f}" if r["slowest_step_s"] else "-"
        out.append(f"| {r['attack']} | {'yes' if r['ok'] else 'NO'} | {ratio} | {slow} | {r['growth_mb']:.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", default=",".join(ALL))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    attacks = [x for x in a.attacks.split(",") if x]
    run = ["--steps", str(a.steps)]
    order = [x for at in attacks for x in ("none", at)]  # a baseline room before each attack
    server = Server().start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n, attack in enumerate(tqdm(order, desc="rooms")):
                rows.append(room(server.url, attack, run, Path(tmp), n))
    finally:
        server.kill()
    body = table(rows)
    print(body)
    if not a.no_write:
        cmd = "./scripts/in-netns.sh .venv/bin/python -m bench.hostile " + " ".join(argv or sys.argv[1:])
        put_section(DOC, BEGIN, END, f"Made by `{cmd.strip()}` on {time.strftime('%Y-%m-%d')} "
                    f"(a 2-core machine; other work ran beside it, so steps/s are noisy: compare each "
                    f"attack with the baseline room run just before it):\n\n{body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
