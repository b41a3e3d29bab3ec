"""Fit step_time.py's CALIBRATIONS on llm-foundry's MPT tables only (bench/data/llm_foundry.csv).

    python bench/fit_efficiency.py bench/data/llm_foundry.csv

A grid search for the parameters that minimise the median absolute log error of the predicted tokens/s
per GPU; prints them, to be pasted into dpo_sweeps/cost/step_time.py's CALIBRATIONS (one set per GPU generation), with the 90th
percentile of the absolute log error (the interval's base width). Never run it on held-out figures.
"""

from __future__ import annotations

import csv
import itertools
import statistics
import sys

from predict_vs_published import log_errors

from dpo_sweeps.cost.step_time import CALIBRATION_OF


def main(path: str) -> int:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for generation in sorted({CALIBRATION_OF[r["gpu"]][0] for r in rows}):
        print(f'"{generation}": {fit([r for r in rows if CALIBRATION_OF[r["gpu"]][0] == generation])},')
    return 0


def fit(rows: list[dict]) -> dict:
    best = None
    grids = {"e_max": [0.6, 0.7, 0.8, 0.9, 1.0],
             "h_half": [0, 200, 400, 700, 1000],
             "e_attn": [0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
             "layer_overhead_s": [0.0, 5e-5, 1e-4, 2e-4],
             "elementwise_bytes": [0, 10, 20, 30, 40, 60, 80]}
    for values in itertools.product(*grids.values()):
        cal = dict(zip(grids, values), log_error_q90=0.0)
        errors = [abs(e) for e in log_errors(rows, cal)]
        score = statistics.median(errors) + 0.25 * statistics.mean(errors)
        if best is None or score < best[0]:
            best = (score, cal, errors)
    _, cal, errors = best
    cal["log_error_q90"] = round(sorted(errors)[int(0.9 * len(errors))], 3)
    return cal


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
