"""The report keeps packed, compiled and padded runs apart (train.packing, train.compile,
train.micro_batch_tokens), labels each config by those overrides, and shows each run's padding share and,
where a run compiled, its compile time."""

from __future__ import annotations

import contextlib
import csv
import io
import statistics
from pathlib import Path

from support.reports import resolved_config, simulated_metrics, write_run

from dpo_sweeps.analysis.report import main

# (overrides, padding share, compile seconds): padded, packed at two budgets, packed and compiled.
CONFIGS = [
    ([], 0.42, None),
    (["train.packing=true"], 0.08, None),
    (["train.packing=true", "train.micro_batch_tokens=1024"], 0.05, None),
    (["train.packing=true", "train.compile=true"], 0.08, 31.5),
]


def _sweep(sweep: Path, configs) -> Path:
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for overrides, padding, compile_s in configs:
        for seed in (0, 1):
            config = resolved_config("full_shard", "bf16", 0.1, 32, seed)
            for override in overrides:
                key, value = override.split("=")
                config["train"][key.split(".")[1]] = int(value) if value.isdigit() else value == "true"
            metrics = {**simulated_metrics("full_shard", "bf16", 0.1, 32, seed),
                       "perf/padding_fraction": padding + 0.01 * seed, "perf/compile_s": compile_s}
            write_run(sweep / str(job), job, [*overrides, f"train.seed={seed}"], config, status="completed",
                      metrics=metrics)
            job += 1
    return sweep


def _report(sweep: Path) -> tuple[list[dict], list[dict], str]:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(sweep)]) == 0

    def rows(name: str) -> list[dict]:
        with (sweep / "report" / name).open(newline="") as handle:
            return list(csv.DictReader(handle))

    return rows("ranking.csv"), rows("runs.csv"), (sweep / "report" / "report.html").read_text()


def test_packed_and_compiled_runs_are_configs_of_their_own_labelled_by_those_overrides(tmp_path):
    configs, runs, page = _report(_sweep(tmp_path / "multirun", CONFIGS))
    labels = {row["config"] for row in configs}
    assert labels == {"(defaults)", "train.packing=true", "train.packing=true train.micro_batch_tokens=1024",
                      "train.packing=true train.compile=true"}
    assert all(row["n"] == "2" for row in configs)
    # Each config's padding share is the mean of its seeds'; the compile time only the compiled one's.
    by_label = {row["config"]: row for row in configs}
    assert float(by_label["train.packing=true"]["perf/padding_fraction"]) == statistics.fmean([0.08, 0.09])
    assert float(by_label["(defaults)"]["perf/padding_fraction"]) == statistics.fmean([0.42, 0.43])
    assert float(by_label["train.packing=true train.compile=true"]["perf/compile_s"]) == 31.5
    assert by_label["train.packing=true"]["perf/compile_s"] == ""
    # The swept settings are columns of their own.
    assert {"train.packing", "train.compile", "train.micro_batch_tokens"} <= set(configs[0])
    assert {row["config"] for row in runs} == labels
    assert {"perf/padding_fraction", "perf/compile_s"} <= set(runs[0])
    assert "perf/<wbr>padding_fraction" in page and "perf/<wbr>compile_s" in page  # the dashboard's headers


def test_without_a_compiled_run_there_is_no_compile_column(tmp_path):
    configs, runs, page = _report(_sweep(tmp_path / "multirun", CONFIGS[:2]))
    assert "perf/padding_fraction" in configs[0] and "perf/padding_fraction" in runs[0]
    assert "perf/compile_s" not in configs[0] and "perf/compile_s" not in runs[0]
    assert "perf/<wbr>padding_fraction" in page and "compile_s" not in page
