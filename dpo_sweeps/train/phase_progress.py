"""Progress lines for the long phases of a run that the step bar does not cover (the reference pass over
every pair before training, an evaluation over the held-out pairs): on a CPU, or on a large held-out set,
each can take minutes, and a run that prints nothing for minutes looks hung.

A line, not a bar: the ranks' output often goes to a log file (a sweep's job, a SLURM task), where a bar's
carriage returns make noise, and a line every `every_s` seconds says the same thing in either place.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("dpo_sweeps")

# A phase shorter than this says nothing but its closing line (the callers' own); a longer one, a line this often.
EVERY_S = 10.0


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


class PhaseProgress:
    """`advance(n)` after each unit of work; a log line (rank 0: `enabled`) at most every `every_s` seconds
    with what is done of `total`, the rate so far and the time left at that rate."""

    def __init__(self, phase: str, total: int, unit: str = "pairs", *, enabled: bool = True,
                 every_s: float = EVERY_S):
        self.phase, self.total, self.unit, self.enabled, self.every_s = phase, total, unit, enabled, every_s
        self.done = 0
        self.started = self.last = time.monotonic()

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every_s or self.done >= self.total:
            return
        self.last = now
        rate = self.done / (now - self.started)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        log.info("%s: %d/%d %s (%d%%), %.1f %s/s, about %s left", self.phase, self.done, self.total, self.unit,
                 100 * self.done // max(1, self.total), rate, self.unit, _duration(left))
