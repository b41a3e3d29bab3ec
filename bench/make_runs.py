"""Write N realistic run directories from a few real ones: for the report and resume benches at scale.

    python bench/make_runs.py SOURCE_SWEEP OUT_DIR N [--vary seed,beta,lr]

Every run of SOURCE_SWEEP (a real sweep's `<n>/summary.json` and `metrics.jsonl`) is copied in turn
into OUT_DIR/0 .. OUT_DIR/N-1 with its config changed: `train.seed` = the copy's number, and with
`--vary beta,lr` also `loss.beta` and `train.lr` from small grids. The copy's overrides, config and
`config_hash` are those a run of that config writes (dpo_sweeps.rundir.summary, rundir.hashing), so a sweep of the
same points resumes them (bench/sweep_scale.py --resume). Its metrics move with the changed values
(deterministically, by the copy's number) so that rankings, fronts and curves have something to show.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpo_sweeps.redaction import scrub_secrets  # noqa: E402
from dpo_sweeps.rundir.hashing import config_hash

BETAS = [0.05, 0.1, 0.2, 0.3, 0.5]
LRS = [1e-3, 3e-3, 1e-2]
# Metrics a copy rescales: accuracy-like ones stay in [0, 1].
SPEED = ("perf/tokens_per_s", "perf/tokens_per_s_per_device", "perf/examples_per_s", "perf/speed_per_memory")
BOUNDED = ("eval/rewards/accuracies", "train/rewards/accuracies")


def set_override(overrides: list[str], key: str, value: object) -> list[str]:
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    return [*kept, f"{key}={value}"]


def varied_metrics(record: dict, rng: random.Random, speed: float, accuracy: float) -> dict:
    out = dict(record)
    for key, value in record.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key == "step":
            continue
        if key in SPEED:
            out[key] = value * speed
        elif key in BOUNDED:
            out[key] = min(1.0, max(0.0, value + accuracy))
        elif "loss" in key:
            out[key] = value * (1.0 - accuracy / 2) * (1 + rng.uniform(-0.01, 0.01))
    return out


def make_runs(source: Path, out: Path, n: int, vary: set[str]) -> None:
    sources = sorted((p for p in source.iterdir() if (p / "summary.json").is_file()), key=lambda p: p.name)
    if not sources:
        raise SystemExit(f"make_runs.py: no run directory with summary.json in {source}")
    templates = [(json.loads((p / "summary.json").read_text()),
                  (p / "metrics.jsonl").read_text().splitlines() if (p / "metrics.jsonl").exists() else [])
                 for p in sources]
    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        summary, lines = templates[i % len(templates)]
        summary = copy.deepcopy(summary)
        rng = random.Random(i)
        config, overrides = summary["config"], list(summary["overrides"])
        config["train"]["seed"] = i
        overrides = set_override(overrides, "train.seed", i)
        if "beta" in vary:
            config["loss"]["beta"] = BETAS[(i // len(templates)) % len(BETAS)]
            overrides = set_override(overrides, "loss.beta", config["loss"]["beta"])
        if "lr" in vary:
            config["train"]["lr"] = LRS[(i // (len(templates) * len(BETAS))) % len(LRS)]
            overrides = set_override(overrides, "train.lr", config["train"]["lr"])
        speed = 1.0 + rng.uniform(-0.15, 0.15) if vary - {"seed"} else 1.0
        accuracy = rng.uniform(-0.1, 0.1) if vary - {"seed"} else 0.0
        summary["overrides"], summary["config"] = overrides, config
        summary["config_hash"] = config_hash(scrub_secrets(config))
        summary["metrics"] = varied_metrics(summary.get("metrics") or {}, rng, speed, accuracy)
        run_dir = out / str(i)
        run_dir.mkdir(exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        if lines:
            records = (varied_metrics(json.loads(line), rng, speed, accuracy) for line in lines if line.strip())
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("n", type=int)
    parser.add_argument("--vary", default="seed", help="comma-separated: seed (always), beta, lr")
    args = parser.parse_args()
    make_runs(args.source, args.out, args.n, set(args.vary.split(",")) | {"seed"})


if __name__ == "__main__":
    main()
