"""Long phases (the reference pass, an evaluation) say how far they are, at what rate and how long is left."""

from __future__ import annotations

import logging
import time

from dpo_sweeps.train.phase_progress import PhaseProgress


def test_a_line_says_done_of_total_the_rate_and_the_time_left(caplog):
    caplog.set_level(logging.INFO, logger="dpo_sweeps")
    progress = PhaseProgress("reference log-probs", 400, "pairs", every_s=0.0)
    time.sleep(0.05)
    progress.advance(100)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("reference log-probs: 100/400 pairs (25%), ")
    rate = float(line.split(", ")[1].split()[0])
    assert 0 < rate <= 100 / 0.05
    assert line.endswith(" left") and "about " in line


def test_no_line_before_its_interval_nor_at_the_end_nor_off_rank_0(caplog):
    caplog.set_level(logging.INFO, logger="dpo_sweeps")
    quiet = PhaseProgress("eval", 10, every_s=3600.0)
    quiet.advance(5)
    ended = PhaseProgress("eval", 10, every_s=0.0)
    ended.advance(10)  # the caller's own closing line says it is done
    other_rank = PhaseProgress("eval", 10, every_s=0.0, enabled=False)
    other_rank.advance(5)
    assert caplog.records == []
