"""`dpo-sweeps-report SWEEP --to mlflow URI` / `--to tensorboard DIR`: a finished sweep's runs sent to a
tracker afterwards, from their run directories (the config, metrics.jsonl, summary.json), through the same
Tracker a running job uses. Once: each run is found again by its identity (tracking.json's run_uid), and
only the steps the tracker lacks are sent, so uploading again adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpo_sweeps.analysis.runs import discover, nearest_sweep
from dpo_sweeps.config.schema import Config
from dpo_sweeps.rundir.summary import SummaryUnreadable, load_summary
from dpo_sweeps.tracking.backend import REGISTRY, Backend, missing_libraries
from dpo_sweeps.tracking.mlflow_uri import MLFLOW_URI_ACCEPTED, mlflow_uri_problem
from dpo_sweeps.tracking.run_info import sweep_group
from dpo_sweeps.tracking.tracker import UPLOADS, Tracker

TARGETS = UPLOADS


class UploadRefused(ValueError):
    """The target cannot be uploaded to (one line)."""


@dataclass
class Uploaded:
    runs: int = 0
    points: int = 0  # metric points the tracker did not hold before
    skipped: tuple[str, ...] = ()  # run directories without a summary.json (not finished)
    failed: tuple[str, ...] = ()  # runs whose upload failed (the warnings say why)


def check_target(kind: str, where: str) -> None:
    """Refuse, before uploading anything, a target this command cannot reach."""
    if kind not in TARGETS:
        raise UploadRefused(f"--to: got {kind!r} (accepted: {', '.join(TARGETS)})")
    if missing_libraries([kind]):
        raise UploadRefused(f"--to {kind}: the {REGISTRY[kind].library} library is not installed ({REGISTRY[kind].pip})")
    if kind == "mlflow" and (problem := mlflow_uri_problem(where)):
        raise UploadRefused(f"--to mlflow URI: {problem} (accepted: {MLFLOW_URI_ACCEPTED})")


def _backend(kind: str, where: str, cfg: Config, root: Path, run_dir: Path) -> Backend:
    if kind == "mlflow":
        from dpo_sweeps.tracking.mlflow_backend import MlflowBackend

        return MlflowBackend(where, cfg.tracking.mlflow.experiment_name)
    from dpo_sweeps.tracking.tensorboard_backend import TensorboardBackend

    # DIR/<sweep>/<run>: `tensorboard --logdir DIR` shows every uploaded sweep, each run apart.
    relative = run_dir.resolve().relative_to(root.resolve().parent)
    return TensorboardBackend(Path(where) / relative)


def upload(roots: list[Path], kind: str, where: str) -> Uploaded:
    """Every finished run under `roots` to the tracker `kind` at `where`."""
    check_target(kind, where)
    done = Uploaded()
    for root in roots:
        run_dirs, sweep_dirs = discover(Path(root))
        for run_dir in run_dirs:
            try:
                summary = load_summary(run_dir)
            except (FileNotFoundError, SummaryUnreadable):
                done.skipped += (str(run_dir),)
                continue
            cfg = Config.of(summary.config)
            in_sweep = run_dir.resolve() != Path(root).resolve()
            sweep_dir = nearest_sweep(run_dir, sweep_dirs, Path(root)) if in_sweep else None
            group = sweep_group(sweep_dir) if sweep_dir is not None else run_dir.name
            name = f"{group}/{run_dir.name}" if in_sweep else run_dir.name
            tracker = Tracker(cfg, run_dir=run_dir, name=name, group=group, sweep_dir=sweep_dir,
                              config=summary.config, enabled=True, plan_label=(summary.plan or {}).get("label"),
                              backends=[_backend(kind, where, cfg, Path(root), run_dir)])
            if not tracker.backends:
                done.failed += (str(run_dir),)
                continue
            tracker.replay()
            record = tracker.end(summary) or {}
            if (record.get(kind) or {}).get("missed"):
                done.failed += (str(run_dir),)
            done.runs += 1
            done.points += tracker.sent
    return done
