"""One config trained (stage 3 of the road from the command to the step, docs/architecture.md).

`train(cfg, hydra_cfg)` resolves the config and checks it, then trains it on as many ranks as it asks
for: as one rank (under torchrun or a multi-task submitit job), or by starting `resources.nproc_per_node`
local rank processes (`dpo_sweeps.runtime.local_ranks`), or in this process. The Hydra task function
(`dpo_sweeps.task.run`) and the Python API (`dpo_sweeps.api.train`) call it. What one rank does, from
binding its cores to writing summary.json, is `dpo_sweeps.train.lifecycle.run_rank`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpo_sweeps.checks.schema_errors import schema_refusal
from dpo_sweeps.checks.unused import Launch, check_settings_used
from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config
from dpo_sweeps.config.tracking_schema import move_renamed
from dpo_sweeps.cost.forecast import print_run_forecast
from dpo_sweeps.errors import InvalidConfig, RunFailure, failure_of, interrupted_before_training
from dpo_sweeps.parallel.allocator import GLIBC, allocator_in_use, run_allocator
from dpo_sweeps.parallel.rank_env import RankEnv, free_port, from_submitit_env, from_torchrun_env
from dpo_sweeps.redaction import scrub_secrets, secret_values
from dpo_sweeps.run_end import RunRefused
from dpo_sweeps.rundir.hashing import config_difference, config_hash
from dpo_sweeps.rundir.hydra_record import redact_files, render_hydra_record, write_hydra_record
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.paths import is_path_error, unwritable_path
from dpo_sweeps.rundir.summary import Status, Summary, read_summary
from dpo_sweeps.runtime.context import RunContext, attempt_id
from dpo_sweeps.runtime.local_ranks import spawn_local_ranks
from dpo_sweeps.runtime.owner import prepare_run_dir, refused_summary, write_failed
from dpo_sweeps.runtime.startup import surface_ctrl_c
from dpo_sweeps.tracking.run_info import sweep_group
from dpo_sweeps.train.entry import start_rank, training_rank


def train(cfg: DictConfig, hydra_cfg: DictConfig, *, refuse_invalid: bool = False) -> Summary:
    """Train one config as the Hydra job `hydra_cfg` (HydraConfig's node) describes it, on as many ranks
    as it asks for; returns its summary, completed or failed. Raises RunRefused when it will not train
    (a setting that cannot work, a run directory it cannot write or that holds another config's run).
    The Hydra task function (dpo_sweeps.task.run) calls it, and dpo_sweeps.api for a run in the caller's
    process.

    It trains as one rank of torchrun or of a multi-task submitit job (rank 0 takes the run directory),
    or takes the run directory and starts `resources.nproc_per_node` local rank processes, or trains in
    this process; each rank is `run_rank` (dpo_sweeps/train/lifecycle.py).

    `refuse_invalid`: a single run's setting that validation refuses raises RunRefused before anything is
    written (dpo_sweeps.api), where the command writes its failed summary (kind invalid_config)."""
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    torchrun_rank = from_torchrun_env()  # this process is one rank of a torchrun launch (None: it is not)
    ctx = run_context(cfg, hydra_cfg)
    if not multirun:  # a sweep checks its settings over all its points before launch (launchers/preflight.py)
        checked = checked_config(ctx, torchrun_rank, refuse_invalid)
        # A sweep skips its completed runs itself (and `hydra.sweeper.resume=false` means run them again).
        done = completed_run(ctx)
        if done is not None:
            print(f"run already complete: {ctx.run_dir / 'summary.json'} (checkpoint.resume=false trains it again)",
                  file=sys.stderr)
            return done
        if torchrun_rank is None:  # torchrun's ranks are the run: none times anything
            time_cost_passes(checked)
    with unwritable_run_dir_refused(ctx):  # the lock, .hydra/ (nothing written then), summary.json
        config = Config.of(ctx.config)  # typed and frozen: nothing changes it
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        rank_env = torchrun_rank or from_submitit_env()
        # A process that trains imports the training stack now, before the run takes its directory: a Ctrl-C
        # during the import leaves the directory as Hydra made it (task.py). One that starts local ranks
        # only supervises them, and never imports it.
        # One rank trains in this process, unless it must start with another malloc than this process has.
        in_process = config.world_size == 1 and run_allocator(config.resources) in (GLIBC, allocator_in_use())
        run_rank = training_rank() if rank_env is not None or in_process else None
        surface_ctrl_c()  # one that came while it imported, lost in a callback (runtime/startup.py)
        if rank_env is not None:  # one rank of torchrun or of a multi-task submitit job: rank 0 takes the lock
            return run_rank(ctx, rank_env, claim_run_dir=True)
        try:
            lock = take_run_dir(ctx)
        except RunDirInUse as exc:
            return refused_summary(ctx, exc)
        try:
            prepare_run_dir(ctx.run_dir, config)
            try:
                validate_config(config, ctx.base_dir)
            except RunFailure as exc:
                return write_failed(ctx, failure_of(exc))
            if not multirun:  # "1 run, about N min on this machine" before it trains (cost/forecast.py)
                print_run_forecast(config, ctx.run_dir)
            if run_rank is None:
                return spawn_local_ranks(ctx, config, start_rank)
            port = config.resources.master_port or free_port()
            rank_env = RankEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                               master_addr="127.0.0.1", master_port=port)
            return run_rank(ctx, rank_env)
        except KeyboardInterrupt:  # before run_rank took the signals over (it turns Ctrl-C into a clean stop)
            return write_failed(ctx, interrupted_before_training())
        finally:
            lock.release()


def run_context(cfg: DictConfig, hydra_cfg: DictConfig) -> RunContext:
    """What every rank of the run is handed: the resolved config, where the run writes, its name and group,
    and its .hydra/ record with the secrets redacted. Raises RunRefused (nothing written) for a required
    setting left unset (???) or an interpolation that does not resolve."""
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        # The former wandb.* keys moved to tracking.wandb.* here, so summary.json records what the run acted on.
        config = move_renamed(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
    except OmegaConfBaseException as exc:
        raise RunRefused(schema_refusal(exc) or InvalidConfig(
            str(getattr(exc, "full_key", "") or "config"), str(exc).strip().splitlines()[0],
            "a value that resolves"), nothing_written=True) from None
    ctx = RunContext(
        run_dir=run_dir,
        config=config,
        overrides=list(hydra_cfg.overrides.task),
        base_dir=Path.cwd(),
        dir_setting="hydra.sweep.dir" if multirun else "hydra.run.dir",
        run_name=f"{sweep_group(Path(hydra_cfg.sweep.dir))}/{hydra_cfg.job.num}" if multirun else run_dir.name,
        group=sweep_group(Path(hydra_cfg.sweep.dir)) if multirun else run_dir.name,
        # Absolute as Hydra makes the run directory (run_job): a find_best job's is <root>/probes/N.
        sweep_dir=Path(os.path.abspath(hydra_cfg.sweep.dir)) if multirun else None,
        attempt=attempt_id(),
        started_at=time.time(),
    )
    secrets = secret_values(ctx.config, dict(os.environ))
    # .hydra/ is written by the job that takes the run directory (hydra_record.py), secrets redacted;
    # a user who sets hydra.output_subdir has Hydra write it there too, before we run: redact that copy.
    ctx.hydra_record = render_hydra_record(cfg, secrets)
    if hydra_cfg.output_subdir is not None:
        redact_files(sorted((run_dir / str(hydra_cfg.output_subdir)).glob("*.yaml")), secrets)
    return ctx


def checked_config(ctx: RunContext, torchrun_rank: RankEnv | None, refuse_invalid: bool) -> Config:
    """A single run's typed config, once its settings pass the checks made before launch: each setting set is
    read by this run, the estimated memory fits `resources.device_memory_gib`, and with `refuse_invalid`
    validation passes. Raises RunRefused (nothing written) naming the setting; under torchrun rank 0 says it."""
    try:
        launch = Launch.TORCHRUN if torchrun_rank is not None else Launch.DPO_SWEEPS
        typed = Config.of(ctx.config)
        check_settings_used(typed, ctx.overrides, launch)
        if refuse_invalid:
            refuse_invalid_settings(typed, ctx.base_dir)
        check_device_memory(typed, ctx.base_dir)
    except InvalidConfig as exc:
        raise RunRefused(exc, nothing_written=True, quiet=os.environ.get("RANK", "0") != "0") from None
    return typed


@contextmanager
def unwritable_run_dir_refused(ctx: RunContext) -> Iterator[None]:
    """A run directory that cannot be written (the lock, .hydra/, summary.json) refuses the run, naming the
    path and the setting that moves it (nothing written); any other OSError goes on as it is."""
    try:
        yield
    except OSError as exc:
        if not is_path_error(exc):
            raise
        raise RunRefused(unwritable_path(exc, ctx.run_dir, ctx.dir_setting), nothing_written=True) from None


def take_run_dir(ctx: RunContext) -> RunDirLock:
    """The run directory's lock, then its .hydra/ record (rundir/hydra_record.py); raises RunDirInUse when
    another job holds it. A .hydra/ that cannot be written gives the lock back and leaves nothing there."""
    lock = RunDirLock(ctx.run_dir).acquire()
    try:
        write_hydra_record(ctx.run_dir, ctx.hydra_record)
    except OSError:
        lock.release(refused=True)
        raise
    return lock


def refuse_invalid_settings(cfg: Config, base_dir: Path) -> None:
    """Raises the InvalidConfig of the first setting validation refuses. Data it cannot find (DataError) is
    left to the run, which fails with it in its summary (kind data_error), as every data error does."""
    try:
        validate_config(cfg, base_dir)
    except InvalidConfig:
        raise
    except RunFailure:
        pass


def check_device_memory(cfg: Config, base_dir: Path) -> None:
    """With `resources.device_memory_gib` set, a run gets the fit check a sweep's point gets
    (parallel/fit.py): one estimated not to fit its device is refused before it starts. An invalid
    config is left to validation, which names its setting."""
    if cfg.resources.device_memory_gib is None:
        return
    from dpo_sweeps.parallel.fit import check_fit

    try:
        validate_config(cfg, base_dir)
    except RunFailure:
        return
    fit = check_fit(cfg, cfg.world_size)
    if fit is not None and not fit.fits:
        raise InvalidConfig("resources.device_memory_gib",
                            f"the estimated peak, {fit.estimate_gib:.2f} GiB per device, exceeds {fit.limit_gib:g} GiB",
                            "a limit the run fits in, a config that fits (fewer tokens per micro-batch, more "
                            "sharding), or leave resources.device_memory_gib out to start it anyway")


def time_cost_passes(cfg: Config) -> None:
    """cluster=cpu: a single run times its point's passes before its ranks start, as a sweep does for its
    points before launch (launchers/cost_screen.py), so that the run records its predicted step time; a
    rank never times anything itself (cost/predict.py). A config the prediction cannot read is left to
    validation, and the run then records why it has no prediction."""
    if cfg.cluster is None or not cfg.cluster.measured:
        return
    from dpo_sweeps.cost.predict import predict_config, profile_of_config

    try:
        predict_config(cfg, profile_of_config(cfg))
    except (OSError, ValueError, RunFailure):
        pass


def completed_run(ctx: RunContext) -> Summary | None:
    """The summary of the completed run of this config already in the run directory (None: train).

    A completed run of another config there is refused, as checkpoints of another config are;
    `checkpoint.resume=false` trains the directory again.
    """
    summary = read_summary(ctx.run_dir)
    if summary is None or summary.status != Status.COMPLETED or not Config.of(ctx.config).checkpoint.resume:
        return None
    if summary.config_hash == config_hash(scrub_secrets(ctx.config)):
        return summary
    refusal = InvalidConfig(
        "hydra.run.dir", f"{ctx.run_dir} holds a completed run of a different config "
        f"({config_difference(summary.config, scrub_secrets(ctx.config))})",
        "another hydra.run.dir, the same command as that run, or checkpoint.resume=false to train it again")
    raise RunRefused(refusal, line=f"error: run refused ({refusal.kind}): {refusal}")
