"""`python tests/support/library_writes.py FOLDER`: the writers a run uses, each writing into FOLDER inside
`writing(path)` (dpo_sweeps/rundir/paths.py), as the run does; prints one JSON object: per writer, the
errno and file of the OSError that came out, or the type of whatever else did ("written" when it wrote).

Run by tests/integration/test_faults_paths.py where FOLDER cannot be written (no permission, a read-only
file system): each library reports that in its own type (torch.save a RuntimeError, safetensors a
SafetensorError, tokenizers a bare Exception, sqlite an OperationalError, torch.distributed.checkpoint a
CheckpointException); what comes out of `writing` must be an OSError naming the path."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path


def writers(folder: Path) -> dict:
    import optuna
    import torch
    import torch.distributed.checkpoint as dcp
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tensors = {"w": torch.ones(4)}
    return {
        "torch.save": (folder / "state.pt", lambda p: torch.save(tensors, p)),
        "dcp.save": (folder / "checkpoint", lambda p: dcp.save(tensors, checkpoint_id=str(p))),
        "safetensors": (folder / "model.safetensors", lambda p: save_file(tensors, str(p))),
        "tokenizers": (folder / "tokenizer.json", lambda p: Tokenizer(models.BPE()).save(str(p))),
        "optuna sqlite": (folder / "optuna.db", lambda p: optuna.create_study(storage=f"sqlite:///{p}")),
        "optuna journal": (folder / "optuna.journal",
                           lambda p: optuna.create_study(storage=JournalStorage(JournalFileBackend(str(p))))),
    }


def outcome(path: Path, write) -> dict:
    from dpo_sweeps.rundir.paths import writing

    try:
        with writing(path):
            write(path)
    except OSError as exc:
        return {"errno": exc.errno, "file": exc.filename}
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        return {"raised": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {"written": True}


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    target = Path(sys.argv[1])
    print(json.dumps({name: outcome(path, write) for name, (path, write) in writers(target).items()}))
