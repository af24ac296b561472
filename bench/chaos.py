"""Chaos bench: scripted faults in rooms of real ``daisy-peer`` processes (bench/chaos_peer.py:
daisy-peer plus two chaos handles) over real aiortc data channels, with a real
``daisychain serve`` process for signaling, on loopback. Run it in the private network
namespace:

    ./scripts/in-netns.sh .venv/bin/python -m bench.chaos            # every trial, RELIABILITY.md
    ./scripts/in-netns.sh .venv/bin/python -m bench.chaos --only kill-host --repeat 1 --no-write

Each trial: a host and two members train a small digits run (hidden 32); once the host has
committed a few steps (a random number), one fault is injected:

  none            no fault (the baseline of the time lost)
  kill-member     SIGKILL a random member
  kill-host       SIGKILL the host (the coordinator): the next member takes over
  straggler       SIGSTOP a random member for 2 s, then SIGCONT
  straggler-host  SIGSTOP the host for 2 s, then SIGCONT
  close-channel   a member closes its data channel to the coordinator (SIGUSR1)
  restart-server  the signaling server is killed and started again at the same address
  garbage         a member sends a burst of malformed frames to everyone (SIGUSR2)
  lie-MODE        a member runs with ``--fault MODE`` (flip, scale, random, stale, nan-meta)
                  and spot-checks on (``--verify-rate``), when this daisy-peer has them

A trial passes when every surviving peer prints the ``params-sha256`` of ``daisychain train``
with the same settings. Liars caught: ``liar removed:`` lines naming the lying peer; false
alarms: ``spot-check mismatch:`` lines naming an honest one. Time lost: the trial's wall
time less the median of the fault-free trials. The table goes to docs/RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "RELIABILITY.md"
PEER = [sys.executable, str(ROOT / "bench" / "chaos_peer.py")]
LIES = ["flip", "scale", "random", "stale", "nan-meta"]
PLAN = (["none"] * 2 + ["kill-member"] * 3 + ["kill-host"] * 3 + ["straggler"] * 3
        + ["straggler-host"] + ["close-channel"] * 3 + ["restart-server"] * 2 + ["garbage"] * 3
        + [f"lie-{m}" for m in LIES])
STEP_RE = re.compile(r"\| *(\d+)/\d+")


def has_faults() -> bool:
    out = subprocess.run([*PEER, "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    return "--fault" in out and "--verify-rate" in out


class Server:
    """``daisychain serve`` on a fixed port, so that a restarted one is at the same address."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "Server":
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "daisychain"), "serve", "--host",
                                      "127.0.0.1", "--port", str(self.port)], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        if "DaisyChain serving on" not in line:
            raise RuntimeError(f"the server did not start: {line}")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Peer:
    def __init__(self, url: str, name: str, args: list[str], tmp: Path):
        self.name = name
        self.err_path = tmp / f"{name}.err"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen([*PEER, "--server", url, "--name", name, "--loopback",
                                      "--capacity", "50", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.out = ""

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def step(self) -> int:
        m = STEP_RE.findall(self.stderr())
        return int(m[-1]) if m else 0

    def wait_for(self, pattern: str, timeout: float) -> re.Match | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            m = re.search(pattern, self.stderr())
            if m:
                return m
            time.sleep(0.05)
        return re.search(pattern, self.stderr())

    def finish(self, timeout: float) -> str | None:
        """The params-sha256 it printed, or None (it failed or ran past the timeout)."""
        try:
            self.out, _ = self.proc.communicate(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        m = re.search(r"^params-sha256: ([0-9a-f]{64})$", self.out, re.M)
        return m.group(1) if m and self.proc.returncode == 0 else None

    def signal(self, sig) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()
        self.err.close()


_REFS: dict = {}


def reference(steps: int, seed: int) -> str:
    key = (steps, seed)
    if key not in _REFS:
        from daisychain.engine.cli import train
        from daisychain.engine.settings import add_run_arguments, settings_from_args
        p = argparse.ArgumentParser()
        add_run_arguments(p)
        s = settings_from_args(p.parse_args(["--hidden", "32", "--steps", str(steps), "--seed", str(seed)]))
        _REFS[key] = train(s, quiet=True)["params_sha256"]
    return _REFS[key]


@dataclass
class Trial:
    n: int
    fault: str
    seed: int
    at_step: int = 0
    victim: str = ""
    survivors: int = 0
    on_hash: int = 0
    passed: bool | None = None   # None: not available
    seconds: float = 0.0
    liars_caught: int = 0
    false_alarms: int = 0
    refusals: int = 0            # "bad frame from" lines (garbage trials)
    note: str = ""
    hashes: dict = field(default_factory=dict)


def run_trial(t: Trial, server: Server, steps: int, tmp: Path, rng: random.Random,
              faults_available: bool, timeout: float) -> Trial:
    if t.fault.startswith("lie-") and not faults_available:
        t.note = "not available: this daisy-peer has no --fault/--verify-rate"
        return t
    run = ["--hidden", "32", "--steps", str(steps), "--seed", str(t.seed)]
    spot = ["--verify-rate", "0.05"] if faults_available else []
    t0 = time.monotonic()
    host = Peer(server.url, f"t{t.n}-host", ["--create-room", "--approve", "all", "--wait-peers",
                                            "2", *run, *spot], tmp)
    peers = [host]
    try:
        m = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})", 60)
        if not m:
            t.passed, t.note = False, "the host made no room: " + host.stderr()[-300:]
            return t
        code = m.group(1)
        liar = None
        for i in (1, 2):
            extra = []
            if t.fault.startswith("lie-") and i == 1:
                extra = ["--fault", t.fault[4:]]
                liar = f"t{t.n}-m{i}"
            peers.append(Peer(server.url, f"t{t.n}-m{i}", ["--room", code, *extra], tmp))
        members = peers[1:]
        t.at_step = rng.randint(5, 25)
        end = time.monotonic() + 60
        while host.step() < t.at_step and time.monotonic() < end and host.proc.poll() is None:
            time.sleep(0.02)
        gone: set = set()
        f = t.fault
        if f == "kill-member":
            v = rng.choice(members)
            v.signal(signal.SIGKILL)
            gone.add(v.name)
        elif f == "kill-host":
            v = host
            host.signal(signal.SIGKILL)
            gone.add(v.name)
        elif f in ("straggler", "straggler-host"):
            v = host if f == "straggler-host" else rng.choice(members)
            v.signal(signal.SIGSTOP)
            time.sleep(2.0)
            v.signal(signal.SIGCONT)
        elif f == "close-channel":
            v = rng.choice(members)
            v.signal(signal.SIGUSR1)
        elif f == "restart-server":
            v = None
            server.kill()
            time.sleep(0.5)
            server.start()
        elif f == "garbage":
            v = rng.choice(members)
            v.signal(signal.SIGUSR2)
        else:
            v = None
        t.victim = v.name.split("-", 1)[1] if v is not None else ("m1 (liar)" if liar else "")
        end = t0 + timeout
        want = reference(steps, t.seed)
        for p in peers:
            if p.name in gone:
                p.finish(5)
                continue
            t.hashes[p.name] = p.finish(end - time.monotonic())
        t.seconds = time.monotonic() - t0
        t.survivors = len(t.hashes)
        t.on_hash = sum(h == want for h in t.hashes.values())
        t.passed = t.survivors > 0 and t.on_hash == t.survivors
        logs = {p.name: p.stderr() for p in peers}
        for name, text in logs.items():
            for line in re.findall(r"liar removed:.*", text):
                if liar and liar in line:
                    t.liars_caught = 1
            for line in re.findall(r"spot-check mismatch:.*", text):
                if not liar or liar not in line:
                    t.false_alarms += 1
            t.refusals += len(re.findall(r"bad frame from", text))
        if not t.passed:
            bad = [n for n, h in t.hashes.items() if h != want]
            t.note = "; ".join(f"{n}: {'no hash' if t.hashes[n] is None else 'other hash'}: "
                               f"{logs[n].strip().splitlines()[-1][-160:] if logs[n].strip() else ''}"
                               for n in bad)
        return t
    finally:
        for p in peers:
            p.kill()


def table(trials: list[Trial], base: float) -> str:
    rows = ["| # | fault | victim | at step | survivors on the reference hash | liars caught | "
            "false alarms | bad frames refused | seconds | time lost (s) | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in trials:
        if t.passed is None:
            rows.append(f"| {t.n} | {t.fault} | | | not run | | | | | | {t.note} |")
            continue
        lost = t.seconds - base
        rows.append(f"| {t.n} | {t.fault} | {t.victim} | {t.at_step} | {t.on_hash}/{t.survivors} "
                    f"{'✓' if t.passed else '✗'} | {t.liars_caught if t.fault.startswith('lie-') else ''} | "
                    f"{t.false_alarms} | {t.refusals if t.fault == 'garbage' else ''} | {t.seconds:.1f} | "
                    f"{'' if t.fault == 'none' else f'{lost:+.1f}'} | {t.note.replace('|', '/')} |")
    return "\n".join(rows)


def summary(trials: list[Trial]) -> str:
    ran = [t for t in trials if t.passed is not None]
    lies = [t for t in ran if t.fault.startswith("lie-")]
    na = [t for t in trials if t.passed is None]
    return (f"{len(trials)} trials, {len(ran)} run, {sum(bool(t.passed) for t in ran)} ended with every "
            f"surviving replica on the reference hash; liars caught {sum(t.liars_caught for t in lies)}"
            f"/{len(lies)}; false alarms {sum(t.false_alarms for t in ran)}"
            + (f"; {len(na)} not available ({', '.join(t.fault for t in na)})" if na else ""))


def write_doc(trials: list[Trial], base: float, steps: int, command: str) -> None:
    import platform
    from datetime import datetime, timezone
    text = f"""# Reliability

What a room survives, measured by `bench/chaos.py`: rooms of three real `daisy-peer` processes
(a host and two members, over real aiortc data channels on loopback, a real `daisychain serve`
for signaling) train a small digits run (hidden 32, {steps} steps, a seed per trial); once the
host has committed a few steps, one fault is injected. A trial passes when every surviving
replica prints the `params-sha256` of `daisychain train` with the same settings.

Faults: `kill-member`/`kill-host` SIGKILL; `straggler`/`straggler-host` SIGSTOP for 2 s, then
SIGCONT; `close-channel`: a member closes its data channel to the coordinator;
`restart-server`: the signaling server is killed and a new one started at the same address;
`garbage`: a member sends 17 malformed frames (noise, bad magic/version/type, impossible chunk
counts and lengths, meta that is not JSON or not a message, an undecodable body, a message
never completed, an oversized frame) to every peer; `lie-MODE`: a member runs with
`daisy-peer --fault MODE` and spot-checks are on. Time lost: a trial's wall time less the
median of the fault-free trials ({base:.1f} s), so it includes the fault's own 2 s for stragglers.

**{summary(trials)}.**

{table(trials, base)}

Command: `{command}`
Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {datetime.now(timezone.utc):%Y-%m-%d}
"""
    DOC.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80, help="steps per run (default 80)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the trial plan (victims, steps)")
    ap.add_argument("--only", action="append", default=None, help="run only this fault (repeatable)")
    ap.add_argument("--repeat", type=int, default=None, help="with --only: trials per fault")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per trial at most")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/RELIABILITY.md")
    args = ap.parse_args(argv)
    if os.environ.get("DAISY_IN_NETNS") != "1":
        print("chaos: run it inside the private network namespace: ./scripts/in-netns.sh "
              ".venv/bin/python -m bench.chaos", file=sys.stderr)
        return 2
    plan = PLAN if not args.only else [f for f in args.only for _ in range(args.repeat or 1)]
    rng = random.Random(args.seed)
    available = has_faults()
    server = Server().start()
    trials: list[Trial] = []
    try:
        with tempfile.TemporaryDirectory(prefix="dc-chaos-") as tmp:
            bar = tqdm(plan, desc="chaos", unit="trial")
            for n, fault in enumerate(bar, 1):
                bar.set_postfix_str(fault)
                t = run_trial(Trial(n, fault, seed=100 + n), server, args.steps, Path(tmp), rng,
                              available, args.timeout)
                trials.append(t)
                state = "n/a" if t.passed is None else ("ok" if t.passed else "FAILED")
                bar.write(f"trial {n:2d} {fault:15s} {state:6s} {t.on_hash}/{t.survivors} on the "
                          f"reference hash, {t.seconds:5.1f} s {t.note[:200]}")
    finally:
        server.kill()
    clean = [t.seconds for t in trials if t.fault == "none" and t.passed]
    base = statistics.median(clean) if clean else float("nan")
    print(summary(trials))
    if not args.no_write:
        write_doc(trials, base, args.steps,
                  "./scripts/in-netns.sh .venv/bin/python -m bench.chaos " + " ".join(argv or sys.argv[1:]))
        print(f"wrote {DOC}")
    return 0 if all(t.passed is not False for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
