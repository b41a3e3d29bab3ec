"""The run's `.hydra/` record (config.yaml, hydra.yaml, overrides.yaml), written by the job that owns
the run directory, once it holds the lock.

Hydra would write these before the task function runs, so a job refused on a busy (or completed)
directory would rewrite the record of the job that owns it. conf/config.yaml sets
`hydra.output_subdir: null`, the task function renders the same three files (secrets redacted), and
the owner writes them after taking the lock (app.py; rank 0 under torchrun and multi-task jobs).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dpo_sweeps.redaction import redact_text
from dpo_sweeps.rundir.atomic import temporary_beside, write_text_atomic
from dpo_sweeps.rundir.paths import writing

RECORD_DIR = ".hydra"


def render_hydra_record(cfg: DictConfig, secrets: set[str]) -> dict[str, str]:
    """The three files as Hydra writes them, every secret (dpo_sweeps/redaction.py) redacted."""
    hydra_cfg = HydraConfig.instance().cfg
    files = {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task),
    }
    return {name: redact_text(text, secrets) for name, text in files.items()}


def redact_files(paths: list[Path], secrets: set[str]) -> None:
    """Redact every secret in these text files in place (a copy of .hydra/*.yaml Hydra wrote itself)."""
    for path in paths:
        if not path.exists():
            continue
        text = path.read_text()
        redacted = redact_text(text, secrets)
        if redacted != text:
            write_text_atomic(path, redacted)


def write_hydra_record(run_dir: Path, files: dict[str, str]) -> None:
    """All three written to temporary files first, then renamed: a write that fails (a full disk) leaves
    the previous record whole (not one file of each), and no temporary file or new folder behind."""
    folder = Path(run_dir) / RECORD_DIR
    new_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    temporary = {name: temporary_beside(folder / name) for name in files}
    try:
        for name, text in files.items():
            with writing(folder / name):
                temporary[name].write_text(text, encoding="utf-8")
    except OSError:
        for tmp in temporary.values():
            tmp.unlink(missing_ok=True)
        if new_folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    for name, tmp in temporary.items():
        os.replace(tmp, folder / name)
