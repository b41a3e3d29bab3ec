"""How busy the machine was while a timing was taken (cluster=cpu's profile and pass timings).

A CPU timing is only as good as the cores it had: on a machine others share (a login node, a laptop
compiling), a multi-threaded pass waits for its slowest thread and a timing can come out several times
too slow, and a cache would keep it for every later forecast. So each timing records the load it was
taken under: the cores busy with other processes over the timing (all cores' busy time less this
process's and its children's own), the 1-minute load average, and the spread of the timing's own
rounds (its median over its fastest: rounds that waited for a core). A timing is `quiet` when no more
than OTHER_CORES cores were busy elsewhere and its rounds agree within SPREAD; else it is provisional:
cached for want of better, said so in the forecast, and taken again at the next quiet chance.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass

OTHER_CORES = 0.5  # cores busy with other processes, on average over the timing, beyond which it is not quiet
SPREAD = 1.5  # median over fastest round beyond which the rounds waited for cores


@dataclass(frozen=True)
class Load:
    """The load one timing was taken under."""

    other_busy_cores: float  # cores busy outside this process and its children, on average
    loadavg_1m: float  # os.getloadavg()'s first figure at the end of the timing
    spread: float | None  # median round over the fastest (None: the timing had no rounds)
    cores: int
    seconds: float

    @property
    def quiet(self) -> bool:
        return self.other_busy_cores <= OTHER_CORES and (self.spread is None or self.spread <= SPREAD)

    def as_dict(self) -> dict:
        return {**asdict(self), "quiet": self.quiet}

    @classmethod
    def of(cls, d: dict | None) -> Load | None:
        if not isinstance(d, dict):
            return None
        try:
            return cls(float(d["other_busy_cores"]), float(d["loadavg_1m"]),
                       None if d.get("spread") is None else float(d["spread"]), int(d["cores"]), float(d["seconds"]))
        except (KeyError, TypeError, ValueError):
            return None

    def text(self) -> str:
        spread = f", rounds spread {self.spread:.2f}x" if self.spread is not None else ""
        return f"{self.other_busy_cores:.1f} other cores busy, load average {self.loadavg_1m:.1f}{spread}"


def _busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (psutil's system-wide times, less idle and iowait)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_seconds() -> float:
    """CPU seconds of this process and its children that were waited for (the profile's gloo ranks)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class LoadWatch:
    """Around a timing: `with LoadWatch() as watch: ...`, then `watch.load(rounds)`."""

    def __enter__(self) -> LoadWatch:
        self._start = (time.monotonic(), _busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        self._end = (time.monotonic(), _busy_seconds(), _own_seconds())

    def load(self, rounds: list[float] | None = None) -> Load:
        wall = max(self._end[0] - self._start[0], 1e-9)
        other = (self._end[1] - self._start[1] - (self._end[2] - self._start[2])) / wall
        spread = statistics.median(rounds) / min(rounds) if rounds and min(rounds) > 0 else None
        return Load(max(0.0, other), os.getloadavg()[0], spread, os.cpu_count() or 1, wall)


def busy_now(seconds: float = 0.3) -> Load:
    """The machine's load over the next `seconds` (this process idle): is now a quiet chance to time?"""
    with LoadWatch() as watch:
        time.sleep(seconds)
    return watch.load()
