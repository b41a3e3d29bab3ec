"""Rows that cannot be a preference pair: why, counted per reason, with where each one was.

A source (sources.py) asks `pair_problem` of each row and drops the ones that have one; tokenization
(train/setup.py) drops the pairs whose responses became identical when cut to data.max_length. What
was dropped is shown on the screen with the first rows of each reason and recorded in summary.json
(`data.dropped_rows`); a source where nothing is left is a DataError giving the counts.

An empty response is kept: it trains as the EOS token alone, as the reference implementation and TRL
train it (HH-RLHF has such rows). Truncation never empties a response: every response has its end token
before it is cut, and it keeps its first data.max_length - data.max_prompt_length >= 1 tokens, so only a
response that was empty to begin with is its end token alone (tests/unit/test_data.py tries prompts longer
than max_length, max_prompt_length next to max_length, both truncation modes, responses ending with their
own end-of-turn token). What truncation can do is make the two responses identical: those pairs are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every reason a row is dropped, as summary.json's data.dropped_rows names it, and what it means.
DROP_REASONS = {
    "missing_value": "a prompt, chosen or rejected value missing or null",
    "not_text": "a value that is neither text nor a list of {role, content} messages",
    "identical": "chosen and rejected identical",
    "identical_after_truncation": "chosen and rejected identical once cut to data.max_length",
    "no_shared_prompt": "HH dialogues whose chosen and rejected prompts differ",
    "no_assistant_turn": "an HH dialogue without '\\n\\nAssistant:'",
}
# Rows named on the screen per reason.
SHOWN_ROWS = 5


@dataclass
class DroppedRows:
    """Where the dropped rows were, by reason."""

    rows: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        assert reason in DROP_REASONS, reason
        self.rows.setdefault(reason, []).append(where)

    def update(self, other: DroppedRows) -> None:
        for reason, places in other.rows.items():
            self.rows.setdefault(reason, []).extend(places)

    def counts(self) -> dict[str, int]:
        return {reason: len(places) for reason, places in self.rows.items()}

    def describe_counts(self) -> str:
        return ", ".join(f"{reason}: {n}" for reason, n in self.counts().items()) or "none"

    def lines(self, described: str) -> list[str]:
        """One screen line per reason: how many, why, and the first rows."""
        out = []
        for reason, places in self.rows.items():
            shown = ", ".join(places[:SHOWN_ROWS]) + (", ..." if len(places) > SHOWN_ROWS else "")
            out.append(f"data: dropped {len(places)} rows of {described} ({reason}: {DROP_REASONS[reason]}): {shown}")
        return out


def _is_messages(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))


def pair_problem(prompt: Any, chosen: Any, rejected: Any) -> str | None:
    """The DROP_REASONS key of a (prompt, chosen, rejected) that cannot be a pair, or None."""
    values = (prompt, chosen, rejected)
    if any(v is None for v in values):
        return "missing_value"
    if not all(isinstance(v, str) or _is_messages(v) for v in values):
        return "not_text"
    if chosen == rejected:
        return "identical"
    return None


def drop_identical_after_truncation(pairs: list, where: list[str], dropped: DroppedRows) -> list:
    """The encoded pairs whose chosen and rejected tokens still differ; the others are counted in `dropped`."""
    kept = []
    for pair, place in zip(pairs, where):
        if pair.chosen == pair.rejected:
            dropped.add("identical_after_truncation", place)
        else:
            kept.append(pair)
    return kept
