"""The best run's greedy replies before and after training (its samples.json, train.sample_prompts),
side by side, with its held-out accuracy beside the zero-shot baseline (train.zero_shot_eval)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

from dpo_sweeps.analysis.runs import PREFERENCE_ACCURACY, Run

SAMPLES_FILE = "samples.json"
ZERO_SHOT_ACCURACY = "eval/zero_shot/accuracy"
POLICY_ACCURACY = "eval/policy/accuracy"  # the trained policy's own preference, measured as the baseline is
# How much of a prompt's end is shown: its last turn and the opening of the reply.
PROMPT_TAIL_CHARS = 240
PRE = "white-space:pre-wrap;max-width:460px;margin:0;font-size:12px"


@dataclass
class BestSamples:
    run: Run
    samples: list[dict[str, str]]  # {"prompt", "before", "after"}


def best_samples(runs: list[Run]) -> BestSamples | None:
    """The completed run with the highest held-out accuracy among those that wrote samples.json."""
    found = []
    for run in runs:
        path = run.path / SAMPLES_FILE
        if run.status == "completed" and path.exists() and run.metrics.get(PREFERENCE_ACCURACY) is not None:
            try:
                found.append(BestSamples(run, json.loads(path.read_text())["samples"]))
            except (OSError, ValueError, KeyError):
                continue  # a samples.json being written or damaged: the other runs still count
    return max(found, key=lambda b: b.run.metrics[PREFERENCE_ACCURACY], default=None)


def accuracy_text(run: Run) -> str:
    """"held-out reward accuracy 0.621 [0.560, 0.678], the policy's own 0.611 [...] vs zero-shot 0.582
    [0.521, 0.641]" (95% intervals; the policy's own where the run logged it)."""
    def one(key: str) -> str:
        low, high = run.metrics.get(f"{key}_ci95_low"), run.metrics.get(f"{key}_ci95_high")
        interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        return f"{run.metrics[key]:.3f}{interval}"

    text = f"held-out reward accuracy {one(PREFERENCE_ACCURACY)}"
    if run.metrics.get(POLICY_ACCURACY) is not None:
        text += f", the policy's own {one(POLICY_ACCURACY)}"
    if run.metrics.get(ZERO_SHOT_ACCURACY) is not None:
        text += f" vs zero-shot {one(ZERO_SHOT_ACCURACY)}"
    return text


def _tail(prompt: str) -> str:
    return ("…" if len(prompt) > PROMPT_TAIL_CHARS else "") + prompt[-PROMPT_TAIL_CHARS:]


def samples_lines(best: BestSamples | None) -> list[str]:
    if best is None:
        return []
    lines = [f"Replies before / after training (best run {best.run.name}: {accuracy_text(best.run)}):"]
    for i, sample in enumerate(best.samples, start=1):
        lines += [f"  [{i}] prompt: ...{' '.join(_tail(sample['prompt']).split())[-120:]}",
                  f"      before: {' '.join(sample['before'].split())}",
                  f"      after:  {' '.join(sample['after'].split())}"]
    return lines


def samples_html(best: BestSamples | None) -> str:
    if best is None:
        return ""
    rows = "".join(
        f'<tr><td class="text"><pre style="{PRE}">{html.escape(_tail(s["prompt"]))}</pre></td>'
        f'<td class="text"><pre style="{PRE}">{html.escape(s["before"])}</pre></td>'
        f'<td class="text"><pre style="{PRE}">{html.escape(s["after"])}</pre></td></tr>' for s in best.samples)
    return (f'<section id="samples"><h2>Replies before and after training</h2><p class="muted">Best run '
            f'{html.escape(best.run.name)}: {html.escape(accuracy_text(best.run))} (95% intervals). Greedy '
            f'replies to held-out prompts (the end of each prompt shown).</p><div class="scroll"><table>'
            f'<thead><tr><th class="text">prompt</th><th class="text">before</th><th class="text">after</th></tr>'
            f'</thead><tbody>{rows}</tbody></table></div></section>')
