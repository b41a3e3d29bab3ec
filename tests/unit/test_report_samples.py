"""The report's replies section: the best run's samples.json before and after training, with its
held-out accuracy beside the zero-shot baseline."""

from __future__ import annotations

import json

from dpo_sweeps.analysis.report import write_report
from dpo_sweeps.analysis.runs import load_runs


def add_samples(run_dir, tag: str, zero_shot: float) -> None:
    (run_dir / "samples.json").write_text(json.dumps({"max_new_tokens": 8, "samples": [
        {"prompt": f"<|im_start|>user\nQuestion {tag}?<|im_end|>\n<|im_start|>assistant\n",
         "before": f"old reply {tag}", "after": f"new reply {tag}"}]}))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["metrics"].update({"eval/zero_shot/accuracy": zero_shot, "eval/zero_shot/accuracy_ci95_low": 0.4,
                               "eval/zero_shot/accuracy_ci95_high": 0.6})
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_the_report_shows_the_best_runs_replies_beside_the_baseline(grid, tmp_path):
    runs, _ = load_runs([grid])
    accuracy = {r.path.name: r.metrics["eval/rewards/accuracies"] for r in runs if r.status == "completed"}
    best, other = sorted(("0", "1"), key=lambda name: -accuracy[name])
    add_samples(grid / best, "best", 0.5)
    add_samples(grid / other, "other", 0.5)
    text, written = write_report([grid], tmp_path / "report")
    assert f"Replies before / after training (best run {best}: held-out reward accuracy " in text
    assert "vs zero-shot 0.500 [0.400, 0.600]" in text
    assert "before: old reply best" in text and "after:  new reply best" in text and "other" not in text
    page = (tmp_path / "report" / "report.html").read_text()
    assert 'id="samples"' in page and "new reply best" in page and "Question best?" in page
