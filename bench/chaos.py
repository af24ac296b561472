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
  lie-MODE        a member runs with ``--fault MODE`` (flip, scale, random, stale, nan-meta);
                  these trials check ``--lie-rate`` of the micro-batches (default 0.1): the
                  liar's unchecked lies are rolled back at its removal; the others run at
                  the default 0.05

A trial passes when every peer still in the run prints the ``params-sha256`` of ``daisychain
train`` with the same settings; a peer the coordinator removed (``liar removed:``) is out of
the run and stopped once only removed peers are left. Liars caught: the liar was removed;
false alarms: alarm lines naming a peer other than the one at fault. Time lost: run seconds
(the host's first committed step to the last survivor's exit) less the median of the
fault-free trials. ``--quick``: one trial per fault; ``--trials N``: the first N of the plan.
``--replicas R --sync-every H``: the same trials on a run with local steps (engine/local.py:
a step is a round; the reference is ``daisychain train`` with the same flags).
The tables go to a marked section of docs/RELIABILITY.md (a run of lie-MODE trials only, to
a section of its own).
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

from bench._proc import wait_for_log

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "RELIABILITY.md"
PEER = [sys.executable, str(ROOT / "bench" / "chaos_peer.py")]
LIES = ["flip", "scale", "random", "stale", "nan-meta"]
# fault-free trials at the start, the middle and the end: the machine's load drifts
PLAN = (["none"] + ["kill-member"] * 3 + ["kill-host"] * 3 + ["straggler"] * 3
        + ["straggler-host"] + ["none"] + ["close-channel"] * 3 + ["restart-server"] * 2
        + ["garbage"] * 3 + [f"lie-{m}" for m in LIES] + ["none"])
#: the alarm lines of run.py; the group is the name of the peer they accuse
ALARM_RE = re.compile(r"(?:spot-check mismatch: |refused a message from |refused a contribution "
                      r"from |liar removed: )(\S+) \(")
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
        self.started_at: float | None = None  # when a committed step was first seen

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def step(self) -> int:
        m = STEP_RE.findall(self.stderr())
        if m and self.started_at is None:
            self.started_at = time.monotonic()
        return int(m[-1]) if m else 0

    def wait_for(self, pattern: str, timeout: float) -> re.Match | None:
        return wait_for_log(self.proc, self.stderr, pattern, timeout)

    def finish(self, timeout: float) -> str | None:
        if self.proc.stdout.closed:
            return None
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
            self.proc.send_signal(signal.SIGCONT)  # a stopped one would not die of SIGKILL at once
            self.proc.kill()
            self.proc.wait(10)
        if not self.proc.stdout.closed:
            self.proc.stdout.close()
        self.err.close()


_REFS: dict = {}


def reference_for(run: list[str]) -> str:
    """The params-sha256 of ``daisychain train`` with these run flags."""
    key = tuple(run)
    if key not in _REFS:
        from daisychain.engine.cli import train
        from daisychain.engine.settings import add_run_arguments, settings_from_args
        p = argparse.ArgumentParser()
        add_run_arguments(p)
        _REFS[key] = train(settings_from_args(p.parse_args(list(run))), quiet=True)["params_sha256"]
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
    caught_at: int | None = None  # the step at which the liar was removed
    rolled_back: int | None = None  # steps the host rolled back at the liar's removal
    told: bool = False              # the liar exited with "removed from the run by ..."
    run_s: float = float("nan")   # the host's first committed step to the last survivor's exit
    started: float | None = None  # seconds to the host's first committed step
    exits: dict = field(default_factory=dict)  # peer -> seconds to its exit
    removed: list = field(default_factory=list)  # peers the coordinator removed (strikes)
    note: str = ""
    hashes: dict = field(default_factory=dict)


#: seconds a peer the coordinator removed from the run may go on after every other is done
REMOVED_GRACE_S = 5.0


def removed_names(peers) -> set[str]:
    """Peers some coordinator removed from the run (``liar removed: NAME (id) ...`` lines)."""
    names = {p.name for p in peers}
    out = set()
    for p in peers:
        for m in re.finditer(r"liar removed: (\S+) \(", p.stderr()):
            if m.group(1) in names:
                out.add(m.group(1))
    return out


def settle(peers, gone: set, deadline: float, exits: dict | None = None) -> set[str]:
    """Wait until every peer that is still in the run has exited (or ``deadline``). A peer
    the coordinator removed gets no totals any more and is out of the run: once only removed
    ones are left, they get REMOVED_GRACE_S, then they are stopped. Returns the removed."""
    only_removed_since = None
    while time.monotonic() < deadline:
        alive = [p for p in peers if p.name not in gone and p.proc.poll() is None]
        if exits is not None:
            for p in peers:
                if p.name not in exits and p.proc.poll() is not None:
                    exits[p.name] = time.monotonic()
        for p in alive:
            p.step()  # notes when it first committed a step
        if not alive:
            break
        removed = removed_names(peers)
        if all(p.name in removed for p in alive):
            only_removed_since = only_removed_since or time.monotonic()
            if time.monotonic() - only_removed_since > REMOVED_GRACE_S:
                break
        else:
            only_removed_since = None
        time.sleep(0.1)
    return removed_names(peers)


LOCAL: list[str] = []  #: --replicas R --sync-every H of every trial's run (main sets it)


def run_trial(t: Trial, server: Server, steps: int, tmp: Path, rng: random.Random,
              faults_available: bool, timeout: float, lie_rate: float = 0.1) -> Trial:
    if t.fault.startswith("lie-") and not faults_available:
        t.note = "not available: this daisy-peer has no --fault/--verify-rate"
        return t
    run = ["--hidden", "32", "--steps", str(steps), "--seed", str(t.seed), *LOCAL]
    # a liar's unchecked contributions are rolled back when it is removed
    spot = (["--verify-rate", str(lie_rate) if t.fault.startswith("lie-") else "0.05"]
            if faults_available else [])
    want = reference_for(run)  # before the clock starts: the trial's time is the room's
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
        t.started = host.started_at - t0 if host.started_at else None
        exits: dict = {}
        removed = settle(peers, gone, t0 + timeout, exits)
        t.exits = {n.split("-", 1)[1]: round(x - t0, 1) for n, x in exits.items()}
        last = [x for n, x in exits.items() if n not in gone and n not in removed]
        t.run_s = (max(last) - host.started_at) if last and host.started_at else float("nan")
        t.seconds = time.monotonic() - t0
        t.removed = sorted(n.split("-", 1)[1] for n in removed)
        for p in peers:
            if p.name in gone or p.name in removed:
                p.kill()
                continue
            t.hashes[p.name] = p.finish(1.0)
        t.survivors = len(t.hashes)
        t.on_hash = sum(h == want for h in t.hashes.values())
        t.passed = t.survivors > 0 and t.on_hash == t.survivors
        logs = {p.name: p.stderr() for p in peers}
        culprit = liar or (v.name if f == "garbage" else None)
        for name, text in logs.items():
            for who in re.findall(ALARM_RE, text):
                if who != culprit:
                    t.false_alarms += 1
            t.refusals += len(re.findall(r"refused a message from", text))
        if liar and liar in removed:
            t.liars_caught = 1
            m = re.search(rf"^liar removed: {re.escape(liar)} \(\w+\) at step (\d+)$",
                          "".join(p.out for p in peers), re.M)
            t.caught_at = int(m.group(1)) if m else None
            rb = re.findall(r"rolled back (\d+) steps?: liar " + re.escape(liar), logs[host.name])
            t.rolled_back = sum(map(int, rb))
            t.told = "removed from the run by" in logs[liar]
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
    rows = ["| # | fault | victim | at step | survivors on the reference hash | removed | liar caught "
            "(at step), steps rolled back | false alarms | bad frames refused | seconds | run seconds | time lost (s) | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in trials:
        if t.passed is None:
            rows.append(f"| {t.n} | {t.fault} | | | not run | | | | | | | | {t.note} |")
            continue
        lost = t.run_s - base
        caught = (("yes" + (f" ({t.caught_at})" if t.caught_at is not None else "")
                   + f", {t.rolled_back} rolled back" + (", told" if t.told else ""))
                  if t.liars_caught else "no") if t.fault.startswith("lie-") else ""
        rows.append(f"| {t.n} | {t.fault} | {t.victim} | {'' if t.fault.startswith('lie-') else t.at_step} | {t.on_hash}/{t.survivors} "
                    f"{'✓' if t.passed else '✗'} | {', '.join(t.removed)} | {caught} | "
                    f"{t.false_alarms} | {t.refusals if t.fault == 'garbage' else ''} | {t.seconds:.1f} | "
                    f"{t.run_s:.1f} | "
                    f"{'' if t.fault == 'none' or lost != lost else f'{lost:+.1f}'} | {t.note.replace('|', '/')} |")
    return "\n".join(rows)


def per_fault(trials: list[Trial], base: float) -> str:
    """One row per fault: trials, runs on the reference hash, liars caught, false alarms and
    the median time lost."""
    rows = ["| fault | trials | ended on the reference hash | liars caught | false alarms | "
            "median time lost (s) |", "|---|---|---|---|---|---|"]
    kinds = list(dict.fromkeys(t.fault for t in trials))
    for f in kinds:
        ts = [t for t in trials if t.fault == f and t.passed is not None]
        if not ts:
            rows.append(f"| {f} | not run | | | | |")
            continue
        lie = f.startswith("lie-")
        lost = statistics.median(t.run_s - base for t in ts)
        rows.append(f"| {f} | {len(ts)} | {sum(bool(t.passed) for t in ts)}/{len(ts)} | "
                    f"{f'{sum(t.liars_caught for t in ts)}/{len(ts)}' if lie else ''} | "
                    f"{sum(t.false_alarms for t in ts)} | {'' if f == 'none' or lost != lost else f'{lost:+.1f}'} |")
    return "\n".join(rows)


def summary(trials: list[Trial]) -> str:
    ran = [t for t in trials if t.passed is not None]
    lies = [t for t in ran if t.fault.startswith("lie-")]
    na = [t for t in trials if t.passed is None]
    return (f"{len(trials)} trials, {len(ran)} run, {sum(bool(t.passed) for t in ran)} ended with every "
            f"surviving replica on the reference hash; liars caught {sum(t.liars_caught for t in lies)}"
            f"/{len(lies)}; false alarms {sum(t.false_alarms for t in ran)}"
            + (f"; {len(na)} not available ({', '.join(t.fault for t in na)})" if na else ""))


BEGIN, END = "<!-- bench/chaos.py: begin -->", "<!-- bench/chaos.py: end -->"
#: a run of lie-MODE trials only (``--only lie-...``) has a section of its own
LIE_BEGIN, LIE_END = "<!-- bench/chaos.py lies: begin -->", "<!-- bench/chaos.py lies: end -->"


def put_section(doc: Path, begin: str, end: str, body: str) -> None:
    """Replace the text between the ``begin`` and ``end`` markers of ``doc`` (or append it)."""
    text = doc.read_text() if doc.exists() else "# Reliability\n"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


def write_doc(trials: list[Trial], base: float, steps: int, command: str) -> None:
    import platform
    from datetime import datetime, timezone
    baseline = (f" Baseline (median run seconds of the fault-free trials): {base:.1f} s."
                if base == base else "")  # (no fault-free trial: no baseline, no time lost)
    body = f"""**{summary(trials)}.**{baseline}

Per fault:

{per_fault(trials, base)}

Every trial:

{table(trials, base)}

Command: `{command}`
Machine: {platform.machine()}, {os.cpu_count()} cores (shared with other work while it ran),
Python {platform.python_version()}, {datetime.now(timezone.utc):%Y-%m-%d}, {steps} steps per run."""
    lies = all(t.fault.startswith("lie-") for t in trials)
    put_section(DOC, *((LIE_BEGIN, LIE_END) if lies else (BEGIN, END)), body)


def make_plan(args) -> list[str]:
    if args.only:
        return [f for f in args.only for _ in range(args.repeat or 1)]
    plan = list(dict.fromkeys(PLAN)) if args.quick else PLAN
    if args.trials:
        plan = [plan[i % len(plan)] for i in range(args.trials)]
    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 80; --quick 40)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the trial plan (victims, steps)")
    ap.add_argument("--trials", type=int, default=None,
                    help=f"the first N trials of the plan (default all {len(PLAN)}; more repeat it)")
    ap.add_argument("--quick", action="store_true",
                    help="one trial of each fault, 40 steps each (a smoke run)")
    ap.add_argument("--only", action="append", default=None, choices=sorted(set(PLAN)),
                    help="run only this fault (repeatable)")
    ap.add_argument("--repeat", type=int, default=None, help="with --only: trials per fault")
    ap.add_argument("--lie-rate", type=float, default=0.1,
                    help="--verify-rate of the lie-MODE trials (default 0.1)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per trial at most (default 180)")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/RELIABILITY.md")
    ap.add_argument("--logs", metavar="DIR", default=None,
                    help="keep every peer's stderr in DIR (default: a temporary folder, removed)")
    ap.add_argument("--replicas", type=int, default=1, help="local steps: replicas (default 1)")
    ap.add_argument("--sync-every", type=int, default=1, help="local steps: inner steps a round (default 1)")
    args = ap.parse_args(argv)
    if args.replicas != 1 or args.sync_every != 1:
        LOCAL[:] = ["--replicas", str(args.replicas), "--sync-every", str(args.sync_every)]
    if os.environ.get("DAISY_IN_NETNS") != "1":
        print("chaos: run it inside the private network namespace: ./scripts/in-netns.sh "
              ".venv/bin/python -m bench.chaos", file=sys.stderr)
        return 2
    steps = args.steps or (40 if args.quick else 80)
    plan = make_plan(args)
    rng = random.Random(args.seed)
    available = has_faults()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the peers
    server = Server().start()
    trials: list[Trial] = []
    try:
        with tempfile.TemporaryDirectory(prefix="dc-chaos-") as tmp:
            if args.logs:
                tmp = args.logs
                Path(tmp).mkdir(parents=True, exist_ok=True)
            bar = tqdm(plan, desc="chaos", unit="trial")
            for n, fault in enumerate(bar, 1):
                bar.set_postfix_str(fault)
                t = run_trial(Trial(n, fault, seed=100 + n), server, steps, Path(tmp), rng,
                              available, args.timeout, args.lie_rate)
                trials.append(t)
                state = "n/a" if t.passed is None else ("ok" if t.passed else "FAILED")
                bar.write(f"trial {n:2d} {fault:15s} {state:6s} {t.on_hash}/{t.survivors} on the "
                          f"reference hash, {t.seconds:5.1f} s"
                          f"{' removed ' + ','.join(t.removed) if t.removed else ''}; first step at "
                          f"{t.started if t.started is None else round(t.started, 1)} s, exits "
                          f"{t.exits} {t.note[:300]}")
    finally:
        server.kill()
    clean = [t.run_s for t in trials if t.fault == "none" and t.passed]
    base = statistics.median(clean) if clean else float("nan")
    print(summary(trials))
    if not args.no_write:
        write_doc(trials, base, steps,
                  "./scripts/in-netns.sh .venv/bin/python -m bench.chaos " + " ".join(argv or sys.argv[1:]))
        print(f"wrote {DOC}")
    return 0 if all(t.passed is not False for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
