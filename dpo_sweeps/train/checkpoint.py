"""Sharded training checkpoints in the run directory, with torch.distributed.checkpoint (DCP).

A checkpoint is the whole training state after optimizer step N:

    <run dir>/checkpoints/step_<N>/
        .metadata, __<rank>_0.distcp    policy and optimizer, sharded as FSDP holds them (DCP)
        train_state_rank<r>.pt          step, data position, LR scheduler, loss scaler, RNG states
                                        (torch CPU/CUDA, Python, NumPy) and the last logged metrics
        COMPLETE                        JSON marker, written last, with every file's size

Atomic: every rank writes into `step_<N>.tmp/`; after a barrier rank 0 writes the marker, fsyncs and
renames the folder to `step_<N>`. Only folders named `step_<N>` holding the marker count, so a run
killed mid-save (SIGKILL, node loss) still has its previous checkpoint, and the next attempt removes
the half-written `.tmp` folder. Old checkpoints are renamed away before they are deleted.

A complete checkpoint can still break afterwards (a shard truncated or deleted by a full disk, a
copy, a user). At resume every file is checked against the sizes in the marker; a broken checkpoint
is reported in one line, renamed `step_<N>.broken`, and the run resumes from the newest one that is
intact (`keep_last` >= 2 keeps one to fall back on).

The reference model is not saved: it is rebuilt from the same seed or pretrained weights. Neither are
frozen weights (the base of a run with adapters, peft): they are rebuilt alike, and a checkpoint holds the
trained parameters (the adapters) and their optimizer state only. The data
position is the step itself (GlobalBatchSampler is a pure function of the step), so a resumed run
reads exactly the batches the uninterrupted run would have read.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from dpo_sweeps.errors import DiskFull, InvalidConfig, is_disk_full
from dpo_sweeps.models.adapters import REFERENCE_ADAPTER
from dpo_sweeps.redaction import scrub_secrets
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.checkpoints import (
    BROKEN_SUFFIX,
    MARKER,
    CheckpointInfo,
    checkpoint_problem,
    checkpoints_dir,
    complete_checkpoints,
)
from dpo_sweeps.rundir.hashing import config_difference, config_hash
from dpo_sweeps.rundir.paths import failed_write

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- RNG states
def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This rank's random number generators, in types torch.load(weights_only=True) accepts."""
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# ---------------------------------------------------------------------- helpers
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _from_rank0(value: Any) -> Any:
    """Rank 0's value of `value` on every rank (ranks on different nodes may list files differently)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def trained_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict, bool]:
    """The model's state without its frozen parameters (but with a reference adapter's, which TR-DPO moves:
    train/reference_sync.py), the optimizer's state, and whether any were left out."""
    frozen = {name for name, param in model.named_parameters()
              if not param.requires_grad and f".{REFERENCE_ADAPTER}." not in name}
    model_state, optim_state = get_state_dict(model, optimizer)
    # A 4-bit layer (peft=qlora) also writes its quantization constants, as `<weight's name>.<part>`.
    return ({k: v for k, v in model_state.items() if k not in frozen and _weight_of(k) not in frozen},
            optim_state, bool(frozen))


def _weight_of(key: str) -> str:
    """The parameter a 4-bit layer's quantization constant belongs to (`...q_proj.base_layer.weight`)."""
    head, sep, _ = key.partition(".weight.")
    return head + ".weight" if sep else key


# ---------------------------------------------------------------------- the checkpointer
class Checkpointer:
    """Saves and restores the run's training state; every method is collective unless it says not."""

    def __init__(self, run_dir: Path, checkpoint_cfg, *, rank: int, world_size: int, config: dict,
                 device: torch.device):
        self.folder = checkpoints_dir(run_dir)  # checkpoint_cfg was checked by checks/validate.py
        self.every_steps = checkpoint_cfg.every_steps
        self.keep_last = checkpoint_cfg.keep_last
        self.resume = checkpoint_cfg.resume
        self.keep_when_completed = checkpoint_cfg.keep_when_completed
        self.rank, self.world_size, self.device = rank, world_size, device
        self.config = scrub_secrets(config)  # the marker records it; hashed as summary.json hashes it
        self.config_hash = config_hash(self.config)
        self.last_saved_step: int | None = None
        self.broken: list[str] = []  # checkpoints found broken at resume, "step_N: why"

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0 and step != self.last_saved_step

    # ------------------------------------------------------------------ save
    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             train_state: dict[str, Any], before_commit: Callable[[], None] | None = None,
             reference: torch.nn.Module | None = None) -> Path:
        """Write checkpoint `step` (collective); returns its folder. `before_commit`: a test hook run
        once this rank's files are written, before the ranks agree that the checkpoint is complete.
        `reference`: a reference model that changes during training (TR-DPO), saved beside the policy."""
        final = self.folder / f"step_{step}"
        tmp = self.folder / f"step_{step}.tmp"
        started = time.monotonic()
        try:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            _barrier()
            model_state, optim_state, _ = trained_state(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            if reference is not None:
                state["reference"] = get_model_state_dict(reference)
            dcp.save(state, checkpoint_id=str(tmp))
            rank_file = tmp / f"train_state_rank{self.rank}.pt"
            torch.save({**train_state, "step": step, "rng": capture_rng_state(self.device)}, rank_file)
            with open(rank_file, "rb+") as f:
                os.fsync(f.fileno())
            if before_commit is not None:
                before_commit()
            _barrier()
            if self.rank == 0:
                self._commit(step, tmp, final, started)
        except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
            full = is_disk_full(exc, self.folder)
            if self.rank == 0 and full:  # give the space back: the summary and the earlier files need it
                shutil.rmtree(tmp, ignore_errors=True)
            if full:
                raise DiskFull(f"no space left on device writing checkpoint {tmp}") from exc
            failed = failed_write(exc, tmp)  # no permission, a read-only file system: named, whoever raised it
            if failed is not None and failed is not exc:
                raise failed from exc
            if isinstance(exc, CheckpointException):
                raise RuntimeError(f"checkpoint {tmp} not written: {str(exc).strip().splitlines()[-1]}") from exc
            raise
        _barrier()
        self.last_saved_step = step
        return final

    def _commit(self, step: int, tmp: Path, final: Path, started: float) -> None:
        """Rank 0, once every rank has written: the marker, then the rename that makes it count."""
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        marker = {"step": step, "world_size": self.world_size, "config_hash": self.config_hash,
                  "time": time.time(), "config": self.config, "files": files}
        write_json_atomic(tmp / MARKER, marker)
        _fsync_dir(tmp)
        if final.exists():  # a checkpoint of this step from an earlier attempt: same state, replace it
            self._delete(final)
        os.rename(tmp, final)
        _fsync_dir(self.folder)
        self._prune()
        log.info("checkpoint step %d saved to %s in %.2f s", step, final, time.monotonic() - started)

    def _delete(self, path: Path) -> None:
        doomed = path.with_name(path.name + ".deleting")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _prune(self) -> None:
        if not self.keep_last:
            return
        for old in complete_checkpoints(self.folder.parent)[: -int(self.keep_last)]:
            self._delete(old.path)

    # ------------------------------------------------------------------ restore
    def find_resumable(self) -> CheckpointInfo | None:
        """The latest complete checkpoint to resume from, the same on every rank (collective).

        Raises InvalidConfig when the run directory holds checkpoints of a different config.
        """
        choice: tuple[CheckpointInfo | None, str | None] = (None, None)
        if self.rank == 0 and self.resume:
            info = self._newest_intact()
            problem = None
            if info is not None and info.marker.get("config_hash") != self.config_hash:
                problem = (f"{self.folder} holds checkpoints of a different config "
                           f"({config_difference(info.marker.get('config', {}), self.config)})")
            choice = (info, problem)
        info, problem = _from_rank0(choice)
        self.broken = _from_rank0(self.broken)
        if problem:
            raise InvalidConfig("checkpoint.resume", problem,
                                "the same command in the same hydra.run.dir, another hydra.run.dir, "
                                "or checkpoint.resume=false to start this directory over")
        return info

    def _newest_intact(self) -> CheckpointInfo | None:
        """Rank 0: the newest complete checkpoint whose files are all there; broken ones are set aside."""
        for info in reversed(complete_checkpoints(self.folder.parent)):
            problem = checkpoint_problem(info)
            if problem is None:
                return info
            self.broken.append(f"{info.path.name}: {problem}")
            log.warning("checkpoint %s is broken (%s): set aside as %s%s; trying the one before", info.path, problem,
                        info.path.name, BROKEN_SUFFIX)
            os.rename(info.path, info.path.with_name(info.path.name + BROKEN_SUFFIX))
        return None

    def load(self, info: CheckpointInfo, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             reference: torch.nn.Module | None = None) -> dict[str, Any]:
        """Restore policy, optimizer (and a `reference` saved with them) and this rank's RNG states (collective);
        returns the saved train state."""
        model_state, optim_state, partial = trained_state(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        if reference is not None:
            state["reference"] = get_model_state_dict(reference)
        try:
            dcp.load(state, checkpoint_id=str(info.path))
        except CheckpointException as exc:  # a BaseException: make it an error the run records
            raise RuntimeError(f"checkpoint {info.path} cannot be loaded: {str(exc).strip().splitlines()[-1]} "
                               "(checkpoint.resume=false starts over)") from exc
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(strict=not partial))
        if reference is not None:
            set_model_state_dict(reference, state["reference"])

        rank_file = info.path / f"train_state_rank{self.rank}.pt"
        same_layout = info.marker.get("world_size") == self.world_size and rank_file.exists()
        if not same_layout:
            log.warning("checkpoint %s was saved by %s ranks: RNG states come from rank 0's",
                        info.path, info.marker.get("world_size"))
            rank_file = info.path / "train_state_rank0.pt"
        train_state = torch.load(rank_file, map_location="cpu", weights_only=True)
        restore_rng_state(train_state["rng"], self.device)
        self.last_saved_step = info.step
        return train_state
