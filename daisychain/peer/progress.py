"""The progress line of ``daisy-peer`` and ``daisychain demo``: step, loss, peers, own share,
MB/s on the data channels; loud log lines go above it."""

from __future__ import annotations

import logging
import re
import sys
import time

from tqdm import tqdm

from daisychain.peer import run as R


_NO_SHARE = re.compile(r"(?P<who>.+?) gets no micro-batch of step \d+: (?P<why>.*)")


class Repeats:
    """The coordinator's "X gets no micro-batch of step N: ..." comes at every step; it is
    said once per device, and again only when its reason changes (the step left out)."""

    def __init__(self):
        self.said: dict[str, str] = {}

    def filter(self, text: str) -> str | None:
        """``text`` to print, or None when it only repeats what was said."""
        m = _NO_SHARE.fullmatch(text)
        if m is None:
            return text
        who, why = m.group("who"), m.group("why")
        if self.said.get(who) == why:
            return None
        again = who in self.said
        self.said[who] = why
        return text + (" (changed; said again only when it changes)" if again
                       else " (said once; again only when it changes)")


class Progress:
    def __init__(self, enabled: bool = True, steps: int | None = None, desc: str = "train"):
        self.enabled = enabled
        self.bar = None
        self.steps = steps
        self.desc = desc
        self.t0 = time.perf_counter()
        self.repeats = Repeats()

    def room(self, code: str, node) -> None:
        """Always shown (also with --json, on stderr): the host hands this code out."""
        self.write(f"room {code}")

    def log_handler(self, fmt: str = "daisy-peer: %(message)s") -> logging.Handler:
        """A logging handler that writes above the progress line (so the line stays whole)
        and leaves out the run's own log lines when this progress line shows them (each
        was printed twice: once by logging, once here)."""
        progress = self

        class _Handler(logging.Handler):
            def emit(self, record):
                if progress.enabled and getattr(record, "run_event", False):
                    return
                try:
                    progress.write(self.format(record))
                except Exception:  # noqa: BLE001 - logging must never raise
                    self.handleError(record)

        h = _Handler()
        h.setFormatter(logging.Formatter(fmt))
        return h

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def event(self, e, node) -> None:
        if not self.enabled:
            return
        if isinstance(e, R.Log):
            text = self.repeats.filter(e.text)
            if text is not None:
                self.write(("WARNING: " if e.loud else "") + text)
        elif isinstance(e, R.Refused):
            self.write(f"{e.peer} refused the run: " + "; ".join(e.reasons))
        elif isinstance(e, R.Committed):
            if self.bar is None:
                total = self.steps or (node.run.steps if node.run else None)
                self.bar = tqdm(total=total, initial=e.step, desc=self.desc, unit="step",
                                leave=False, file=sys.stderr)
            self.bar.update(1)
            out, inn = node.mesh.bytes() if node.mesh else (0, 0)
            dt = max(1e-9, time.perf_counter() - self.t0)
            share = f"{e.mine}/{sum(n for _, n in e.contributors)}"
            self.bar.set_postfix_str(f"loss {e.loss:.4f} peers {len(e.contributors)} "
                                     f"share {share} {(out + inn) / dt / 1e6:.2f} MB/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
