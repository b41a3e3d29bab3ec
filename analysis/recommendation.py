"""The staged search's answer (`<sweep>/find_best.json`, written by launchers/find_best.py), for the
report to open with: the recommended run, its figures, the command that trains it, the stages, and
where the sweep trained both, full fine-tuning against adapters side by side (the best run of each);
and the report's own pick over any sweep (`recommend_tied`): the fastest per GiB of the configs tied
with the best accuracy.

find_best.json files written before find_best decided with ties (`accuracy_spread`,
`within_spread_of_best`: the one-standard-error rule) are read too, and shown under their own rule."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpo_sweeps.analysis.ranking import ConfigResult, Ranking
from dpo_sweeps.analysis.runs import PREFERENCE_ACCURACY, SPEED_PER_MEMORY
from dpo_sweeps.rundir.cost import device_time_text
from dpo_sweeps.rundir.paths import FIND_BEST


@dataclass
class Recommendation:
    sweep: Path
    stages: dict[str, Any]
    chosen: dict[str, Any] | None  # None: no training run completed
    by_peft: list[dict[str, Any]]  # the best run of each adapter setting, full fine-tune first


def load_recommendations(sweep_dirs: list[Path]) -> list[Recommendation]:
    found = []
    for sweep in sweep_dirs:
        try:
            result = json.loads((Path(sweep) / FIND_BEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.append(Recommendation(Path(sweep), result.get("stages") or {}, result.get("recommendation"),
                                    result.get("by_peft") or []))
    return found


def _accuracy(chosen: dict[str, Any]) -> str:
    """`0.912 [0.884, 0.937]` (a 95% interval), or `0.912 ± 0.017` from an older file (one standard error)."""
    accuracy = chosen["eval/rewards/accuracies"]
    if "accuracy_spread" in chosen:
        return f"{accuracy:.3f} ± {chosen['accuracy_spread']:.3f}"
    low, high = chosen.get("accuracy_ci95") or (None, None)
    return f"{accuracy:.3f} [{low:.3f}, {high:.3f}]" if low is not None and high is not None else f"{accuracy:.3f}"


def rule_text(chosen: dict[str, Any]) -> str:
    """How the pick was made: among the configs tied with the best, or (older files) within one standard error."""
    if "within_spread_of_best" in chosen:
        return (f"best accuracy, then the fastest per GiB of the {len(chosen['within_spread_of_best'])} run(s) "
                "within its spread (one standard error)")
    return (f"the fastest per GiB of the {len(chosen['tied_with_best'])} config(s) tied with the best accuracy "
            f"(not significantly worse on the held-out pairs), decided by the {chosen['decided_by']}")


def _figures(chosen: dict[str, Any]) -> str:
    parts = [f"preference accuracy {_accuracy(chosen)}"]
    for key, label, fmt in (("perf/speed_per_memory", "tokens/s per GiB", "{:,.0f}"),
                            ("perf/tokens_per_s", "tokens/s", "{:,.0f}"), ("perf/peak_memory_gib", "GiB peak", "{:.2f}")):
        if isinstance(chosen.get(key), (int, float)):
            parts.append(f"{fmt.format(chosen[key])} {label}")
    return ", ".join(parts)


def stages_text(rec: Recommendation) -> str:
    probes, train = rec.stages.get("probes") or {}, rec.stages.get("train") or {}
    return (_stage_zero_text(rec) + f"stage 1-2: {probes.get('runs', 0)} plans checked and probed ({probes.get('skipped_oom_predicted', 0)} "
            f"predicted out of memory, {probes.get('completed', 0)} probed; {device_time_text(probes.get('device_seconds'))}); "
            f"stage 3: {train.get('runs', 0)} full runs on the best plans "
            f"({'; '.join(train.get('plans') or []) or 'none'}), {train.get('completed', 0)} completed "
            f"({device_time_text(train.get('device_seconds'))})" + _replicates_text(rec))


def _replicates_text(rec: Recommendation) -> str:
    replicates = rec.stages.get("replicates")
    if not replicates:
        return ""
    return (f"; stage 4: {replicates.get('runs', 0)} replicate runs ({replicates.get('seeds')} seeds per tied config), "
            f"{replicates.get('completed', 0)} completed ({device_time_text(replicates.get('device_seconds'))})")


def _stage_zero_text(rec: Recommendation) -> str:
    """Stage 0 (a cluster named): the plans not probed and why."""
    predicted = rec.stages.get("predicted") or {}
    skipped = predicted.get("not_probed") or []
    if not skipped:
        return ""
    listed = "; ".join(f"{' '.join(p['overrides'])} ({p['reason']})" for p in skipped)
    return f"stage 0: {len(skipped)} plans not probed, predicted too slow per memory: {listed}; "


PEFT_TITLE = "Full fine-tuning against LoRA"
PEFT_COLUMNS = ("adapters", "preference accuracy", "tokens/s per GiB", "tokens/s", "GiB peak", "run")


def _peft_row(best: dict[str, Any]) -> list[str]:
    def number(key: str, fmt: str) -> str:
        return fmt.format(best[key]) if isinstance(best.get(key), (int, float)) else "-"

    return [best["adapters"], _accuracy(best),
            number("perf/speed_per_memory", "{:,.0f}"), number("perf/tokens_per_s", "{:,.0f}"),
            number("perf/peak_memory_gib", "{:.2f}"), best["run"]]


def peft_lines(rec: Recommendation) -> list[str]:
    """The best run of each adapter setting, when the sweep trained more than one."""
    if len(rec.by_peft) < 2:
        return []
    rows = [list(PEFT_COLUMNS), *map(_peft_row, rec.by_peft)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(PEFT_COLUMNS))]
    return [f"  {PEFT_TITLE} (the best run of each):",
            *("    " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)]


def recommendation_lines(rec: Recommendation) -> list[str]:
    if rec.chosen is None:
        return [f"Recommendation ({rec.sweep}): none, no training run completed", stages_text(rec)]
    c = rec.chosen
    return [f"Recommendation ({rec.sweep}): {c['run']}", f"  {_figures(c)}",
            f"  {rule_text(c)}",
            f"  train it: {c['command']}", f"  {stages_text(rec)}", *peft_lines(rec)]


def peft_html(rec: Recommendation, escape) -> str:
    if len(rec.by_peft) < 2:
        return ""
    head = "".join(f"<th>{escape(c)}</th>" for c in PEFT_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in _peft_row(b)) + "</tr>" for b in rec.by_peft)
    return (f"<h3 id='full-vs-lora'>{escape(PEFT_TITLE)}</h3><p class='muted'>The best run of each adapter setting "
            "(chosen as the recommendation is, among that setting's runs): what adapters cost in accuracy against "
            f"what they save in memory.</p><table><tr>{head}</tr>{body}</table>")


def recommendation_html(rec: Recommendation, escape) -> str:
    if rec.chosen is None:
        body = f"<p>No training run completed, so there is no recommendation.</p><p class='muted'>{escape(stages_text(rec))}</p>"
    else:
        c = rec.chosen
        rule = rule_text(c)
        body = (f"<p><b>{escape(c['run'])}</b>: {escape(_figures(c))}. {escape(rule[:1].upper() + rule[1:])}.</p>"
                f"<pre id='recommended-command'>{escape(c['command'])}</pre>"
                f"<p class='muted'>{escape(stages_text(rec))}</p>" + peft_html(rec, escape))
    return f'<section id="recommendation"><h2>Recommendation</h2>{body}</section>'


# The report's rule, in one line (it replaces the one-standard-error rule of find_best.json's older picks).
TIED_RULE = ("the fastest per GiB of the configs tied with the best accuracy (not significantly worse on the "
             "held-out pairs; it replaces the one-standard-error rule)")


def recommend_tied(ranking: Ranking) -> ConfigResult | None:
    """The fastest per GiB of the configs tied with the best accuracy (by accuracy where none has a speed)."""
    tied = ranking.tied_with_best()
    if not tied:
        return None
    timed = [c for c in tied if SPEED_PER_MEMORY in c.stats]
    if not timed:
        return tied[0]
    return max(timed, key=lambda c: (c.mean(SPEED_PER_MEMORY), c.mean(PREFERENCE_ACCURACY)))


def tied_recommendation_line(ranking: Ranking) -> str | None:
    pick = recommend_tied(ranking)
    if pick is None:
        return None
    return f"Recommended: '{pick.label}', {TIED_RULE}; {len(ranking.tied_with_best())} config(s) tied"
