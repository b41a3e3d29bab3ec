"""DPO training on one rank: the loop over the training step, evaluation and checkpoints.

Every rank runs this, over the one record train/setup.py builds (`TrainingSetup`). The step reads top
to bottom: a global batch of pairs is split across ranks and micro-batches; chosen and rejected go
through one concatenated forward pass (or one prefix-shared row per pair, or rows packed with whole
pairs: data/packing.py); the frozen reference's
log-probs come precomputed with the pairs, or from a reference pass over the same batch without grad;
gradients accumulate to the global batch; fp16 steps go through the rank-consistent loss scaler; the
optimizer steps.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dpo_sweeps.config.schema import Config
from dpo_sweeps.data.encoding import EncodedPair, rank_micro_batch_indices
from dpo_sweeps.dpo.losses import metric_names, uses_reference
from dpo_sweeps.dpo.losses.pairwise import PairLogps, preference_loss
from dpo_sweeps.dpo.response_logps import attention_path
from dpo_sweeps.errors import NonFiniteLoss, RunPruned
from dpo_sweeps.models.build import save_model
from dpo_sweeps.parallel.distributed import all_reduce, gather_rows
from dpo_sweeps.parallel.mfu import BatchPositions
from dpo_sweeps.parallel.plan import resolve_plan
from dpo_sweeps.parallel.rank_env import RankEnv
from dpo_sweeps.rundir.eval_pairs import GATHERED, EvalPairsLog, pair_ids
from dpo_sweeps.rundir.metrics_log import MetricsLog
from dpo_sweeps.rundir.summary import Summary
from dpo_sweeps.runtime.context import RunContext
from dpo_sweeps.runtime.signals import RunInterrupted, StopRequests
from dpo_sweeps.tracking.tracker import Tracker
from dpo_sweeps.train.checkpoint import Checkpointer
from dpo_sweeps.train.faults import fault_in_checkpoint, inject_in_step
from dpo_sweeps.train.final_metrics import final_metrics
from dpo_sweeps.train.perf import PerfMeter
from dpo_sweeps.train.phase_progress import PhaseProgress
from dpo_sweeps.train.probe import is_probe, probe_config
from dpo_sweeps.train.pruning import TrialReporter, pruning_link
from dpo_sweeps.train.reference_sync import due, sync_reference
from dpo_sweeps.train.samples import write_samples
from dpo_sweeps.train.scoring import batch_logps, batch_to, collate_pairs, training_micro_batches
from dpo_sweeps.train.setup import SetupSummary, TrainingSetup, build_training
from dpo_sweeps.train.state import TrainState
from dpo_sweeps.train.zero_shot import zero_shot_from_reference, zero_shot_record, zero_shot_stats

log = logging.getLogger(__name__)

# Per-pair statistics summed over ranks, then divided by the pair count.
PAIR_STATS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
              "logps/chosen", "logps/rejected")


class Trainer:
    def __init__(self, ctx: RunContext, cfg: Config, env: RankEnv, device: torch.device, stop_requests: StopRequests | None = None,
                 heartbeat: Callable[[int, str], None] | None = None):
        # probe.steps: a few steps for speed and memory only, with a config derived for it (probe.py).
        self.probing = is_probe(cfg)
        self.ctx, self.cfg, self.env, self.device = ctx, probe_config(cfg, env.world_size), env, device
        cfg = self.cfg
        # Called at each phase of each step (see watchdog.py): a rank that stops calling it is hung.
        self._beat = heartbeat or (lambda step, phase: None)
        self._last_beat = (0, "setup")
        self.state = TrainState()
        # The one reading of fsdp + precision + resources: mesh, reshard, dtypes, loss scaling, label.
        self.plan = resolve_plan(cfg, world_size=env.world_size)
        self.stop_requests = stop_requests or StopRequests()
        self.metrics_log = MetricsLog(ctx.run_dir) if env.is_main else None
        self.eval_pairs_log: EvalPairsLog | None = None  # rank 0's eval_pairs.parquet, once the pairs are known
        self.perf = PerfMeter(device, cfg.perf.warmup_steps)
        # Positions the training micro-batches computed (rows x width) and how many of them were padding,
        # this attempt's steps: perf/padding_fraction.
        self.computed_positions = 0
        self.padding_positions = 0
        self.stat_names = PAIR_STATS + metric_names(cfg.loss)  # and the loss's own metrics
        self.checkpointer = Checkpointer(ctx.run_dir, cfg.checkpoint, rank=env.rank, world_size=env.world_size,
                                         config=ctx.config, device=device)
        self.resumed_from: int | None = None  # the checkpoint step this attempt started from
        # An Optuna trial with a pruner reports each evaluation to its study; rank 0 holds the connection.
        self.trial_link = pruning_link(ctx.run_dir)
        self.trial_reporter: TrialReporter | None = None
        self.tracker: Tracker | None = None
        # What setup() builds: summary.json's facts as they come (a run that fails in setup reports what
        # it got to), then the one record the loop trains with.
        self.setup_summary = SetupSummary()
        self.built: TrainingSetup | None = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Build what the loop trains with (train/setup.py), then resume from a checkpoint if there is one."""
        cfg, env = self.cfg, self.env
        self.built = build_training(cfg, self.ctx.base_dir, env, self.plan, self.device, probing=self.probing,
                                    stop_requests=self.stop_requests, summary=self.setup_summary)
        self._beat_in_every_block(self.built.policy)
        self.tracker = Tracker(self.cfg, run_dir=self.ctx.run_dir, name=self.ctx.run_name, group=self.ctx.group,
                               sweep_dir=self.ctx.sweep_dir, config=self.ctx.config, enabled=env.is_main,
                               plan_label=self.plan.label)
        if env.is_main and not self.probing:  # a probe's eval scores nothing worth keeping (probe.py)
            self.eval_pairs_log = EvalPairsLog(self.ctx.run_dir,
                                               pair_ids((p.prompt, p.chosen, p.rejected) for p in self.built.eval_pairs))
        self._resume_from_checkpoint()
        if self.trial_link is not None and env.is_main:
            self.trial_reporter = TrialReporter(self.trial_link, self.ctx.run_dir)
        if env.is_main:
            log.info("%s: %.2fM parameters, %d ranks, %s, mesh %s", cfg.model.name_or_path,
                     self.built.num_params / 1e6, env.world_size, self.plan.label, self.plan.mesh)

    def heartbeat(self, step: int, phase: str) -> None:
        self._last_beat = (step, phase)
        self._beat(step, phase)

    def _beat_in_every_block(self, model: torch.nn.Module) -> None:
        """Each transformer block's forward beats again with the phase last reported: one forward pass of a
        large held-out batch (eval_batching sizes them by memory, not time) on a loaded CPU can outlast
        resources.hang_timeout_s, and a pass that moves is not a hang. FSDP2 renames a block's class
        (FSDP<name>), so blocks are found by their class's ancestry."""
        name = self.cfg.model.block_name
        for module in model.modules():
            if any(c.__name__ == name for c in type(module).__mro__):
                module.register_forward_pre_hook(lambda *_: self._beat(*self._last_beat))

    # ------------------------------------------------------------------ forward
    def _collate(self, pairs: list[EncodedPair]) -> dict[str, torch.Tensor]:
        return collate_pairs(pairs, self.built.tokenizer, self.cfg)

    def _pair_losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-pair losses (with grad) and per-pair statistics (detached), for one micro-batch."""
        built = self.built
        batch = batch_to(batch, self.device)
        logps, counts, sums = batch_logps(built.policy, batch, self.cfg)
        ref_logps = None
        if "reference_logps" in batch:  # precomputed (train.precompute_reference_logps)
            ref_logps = batch["reference_logps"]
        elif built.reference is not None:
            with torch.no_grad():
                ref_logps = batch_logps(built.reference, batch, self.cfg)[0]
        elif uses_reference(self.cfg.loss):
            raise RuntimeError("a batch without precomputed reference log-probs after the reference model was freed")
        pairs = PairLogps.split(logps, counts, sums, ref_logps)
        pref = preference_loss(self.cfg.loss, pairs)
        stats = {
            "loss": pref.losses.detach(),
            "rewards/chosen": pref.chosen_rewards,
            "rewards/rejected": pref.rejected_rewards,
            "rewards/accuracies": (pref.chosen_rewards > pref.rejected_rewards).float(),
            "rewards/margins": pref.chosen_rewards - pref.rejected_rewards,
            "logps/chosen": pairs.chosen.detach(),
            "logps/rejected": pairs.rejected.detach(),
            **pref.metrics,
        }
        if pairs.ref_chosen is not None:  # for the held-out pairs' records (eval_pairs.parquet)
            stats.update({"reference/logps/chosen": pairs.ref_chosen, "reference/logps/rejected": pairs.ref_rejected})
        return pref.losses, stats

    # ------------------------------------------------------------------ step
    def _rank_micro_batches(self, step: int) -> list[list[EncodedPair]]:
        built = self.built
        indices = rank_micro_batch_indices(built.sampler.indices(step), self.env.rank, self.env.world_size,
                                           self.cfg.train.micro_batch_size)
        # Packed with a shared prompt: the step's pairs regrouped into as many micro-batches of packed rows.
        return training_micro_batches([[built.train_pairs[i] for i in micro] for micro in indices], self.cfg)

    def train_step(self, step: int) -> dict[str, Any]:
        cfg, built = self.cfg, self.built
        micro_batches = self._rank_micro_batches(step)
        per_rank_pairs = sum(len(mb) for mb in micro_batches)
        sums = torch.zeros(len(self.stat_names), dtype=torch.float64)
        tokens, flops = 0, 0.0

        self.perf.start()
        for pairs in micro_batches:
            self.heartbeat(step + 1, "forward")
            batch = self._collate(pairs)
            tokens += int(batch["num_tokens"])
            self.computed_positions += batch["input_ids"].numel()
            self.padding_positions += batch["input_ids"].numel() - int(batch["num_row_tokens"])
            flops += self._model_flops(pairs)
            losses, stats = self._pair_losses(batch)
            losses = self._inject_fault(step, losses)
            stats["loss"] = losses.detach()  # an injected NaN shows in this step's train/loss
            loss = losses.sum() / per_rank_pairs  # FSDP averages over ranks: the global-batch mean
            self.heartbeat(step + 1, "backward")
            built.scaler.scale_loss(loss).backward()
            sums += torch.stack([stats[k].double().sum().cpu() for k in self.stat_names])

        self.heartbeat(step + 1, "optimizer")
        params = [p for p in built.policy.parameters() if p.grad is not None]
        overflow = built.scaler.unscale_and_check(params)
        grad_norm = None
        if not overflow:
            max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm is not None else math.inf
            total = torch.nn.utils.clip_grad_norm_(params, max_norm)
            grad_norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        lr = built.scheduler.get_last_lr()[0]
        if not overflow:
            built.optimizer.step()
        sync = cfg.train.reference_sync  # TR-DPO (train/reference_sync.py)
        if built.reference is not None and due(step + 1, sync.every_steps):
            sync_reference(built.policy, built.reference, sync.alpha)
        built.scaler.update(overflow)
        built.scheduler.step()
        built.optimizer.zero_grad(set_to_none=True)
        step_time = self.perf.stop(tokens, per_rank_pairs, flops)

        totals = all_reduce(sums.tolist() + [per_rank_pairs])
        count = totals[-1]
        record: dict[str, Any] = {"step": step + 1}
        record.update({f"train/{k}": v / count for k, v in zip(self.stat_names, totals)})
        record.update({"train/grad_norm": grad_norm, "train/lr": lr, "perf/step_time_s": step_time})
        if built.scaler.enabled:
            record.update({"train/loss_scale": built.scaler.scale, "train/skipped_step": overflow})
        if not math.isfinite(record["train/loss"]):
            raise NonFiniteLoss(f"train/loss is {record['train/loss']} at step {step + 1} "
                                f"(lr={lr:g}, precision={self.plan.precision}, loss.beta={cfg.loss.beta})")
        return record

    def _model_flops(self, pairs: list[EncodedPair]) -> float:
        """The model FLOPs of one micro-batch's step (mfu.py), for perf/mfu."""
        positions = BatchPositions.of(pairs, share_prompt=self.cfg.train.share_prompt,
                                      full_logits=self.cfg.train.logps_chunk_size == 0)
        return self.built.model_flops.step(positions, reference_forward=self.built.reference is not None)

    def _inject_fault(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """Test hook: `faults.kind` at `faults.step` on `faults.rank` (dpo_sweeps/train/faults.py)."""
        return inject_in_step(self.cfg.faults, step + 1, self.env.rank, loss, self.resumed_from is not None)

    # ------------------------------------------------------------------ eval
    def evaluate(self) -> dict[str, Any]:
        """Mean statistics over all held-out pairs, split across ranks (each rank runs as many passes); rank 0
        also records every pair's scores (eval_pairs.parquet)."""
        def per_pair(stats: dict) -> dict[str, torch.Tensor]:
            kept = {k: stats[k] for k in self.stat_names}
            if self.cfg.train.zero_shot_eval:  # the baseline's own measure, now of the trained policy
                kept.update({f"policy/{k}": v for k, v in zero_shot_stats(stats).items()})
            return kept

        means, scores = self._score_held_out_pairs(per_pair)
        if not self.probing:
            every_rank = gather_rows(scores)  # collective: rank 0 writes every rank's pairs
            if self.eval_pairs_log is not None:
                self.eval_pairs_log.write(self.state.step, every_rank.numpy())
        return {f"eval/{k}": v for k, v in means.items()}

    def zero_shot_eval(self) -> dict[str, Any]:
        """The policy's own preference on the held-out pairs before training (train/zero_shot.py). The
        precomputed reference log-probs are the starting policy's own, scored alike: no second pass."""
        found = zero_shot_from_reference(self.built.eval_pairs)
        return found or zero_shot_record(self._score_held_out_pairs(zero_shot_stats)[0], len(self.built.eval_pairs))

    @torch.no_grad()
    def _score_held_out_pairs(self, per_pair: Callable[[dict], dict[str, torch.Tensor]]
                              ) -> tuple[dict[str, float], torch.Tensor]:
        """The means over all held-out pairs of `per_pair`'s statistics (of _pair_losses' ones), and this
        rank's scores of each pair it ran (a float64 row of eval_pairs.py's GATHERED columns each, padding
        included). The passes are the ones the reference's eval log-probs were precomputed in (setup.py)."""
        pairs, policy = self.built.eval_pairs, self.built.policy
        n = len(pairs)
        names, sums, count, scores = None, None, 0, []
        policy.eval()
        progress = PhaseProgress("eval", self.env.world_size * sum(map(len, self.built.eval_batches)), "pairs",
                                 enabled=self.env.is_main and not self.probing)
        for idx in self.built.eval_batches:
            self.heartbeat(self.state.step, "eval")
            real = torch.tensor([i < n for i in idx], dtype=torch.float64)
            all_stats = self._pair_losses(self._collate([pairs[i % n] for i in idx]))[1]
            stats = per_pair(all_stats)
            names = names or list(stats)
            batch_sums = torch.stack([(stats[k].double().cpu() * real).sum() for k in names])
            sums = batch_sums if sums is None else sums + batch_sums
            count += int(real.sum())
            scores.append(_pair_scores(idx, all_stats))
            progress.advance(self.env.world_size * len(idx))
        policy.train()
        totals = all_reduce(sums.tolist() + [count])
        return {k: v / totals[-1] for k, v in zip(names, totals)}, torch.cat(scores)

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        max_steps = cfg.train.max_steps
        self.built.policy.train()
        bar = tqdm(total=max_steps, initial=self.state.step, desc="dpo", unit="step", dynamic_ncols=True,
                   disable=not (self.env.is_main and cfg.train.progress_bar))
        if self.state.step == 0 and cfg.train.zero_shot_eval and not self.probing:
            self.state.zero_shot = self.zero_shot_eval()
            self._log({"step": 0, **self.state.zero_shot})
        started = time.monotonic()
        try:
            while self.state.step < max_steps:
                record = self.train_step(self.state.step)
                self.state.step += 1
                self.state.last_train = record
                step = self.state.step
                if step % cfg.train.log_every == 0 or step == max_steps:
                    self._log(record)
                eval_due = cfg.train.eval_every and step % cfg.train.eval_every == 0
                if eval_due or step == max_steps:
                    eval_started = time.perf_counter()
                    self.state.last_eval = {"step": step, **self.evaluate()}
                    self._log({**self.state.last_eval, "perf/eval_time_s": time.perf_counter() - eval_started})
                    if step < max_steps:
                        self._report_to_trial(step)
                bar.update(1)
                bar.set_postfix(loss=f"{record['train/loss']:.4f}",
                                acc=f"{record['train/rewards/accuracies']:.2f}")
                self._checkpoint_or_stop()
                if self._probe_time_is_up(started):
                    break
        finally:
            bar.close()
        return self.final_metrics()

    def _probe_time_is_up(self, started: float) -> bool:
        """probe.max_seconds: whether the probe has run long enough, once it has a timed step; every rank
        takes the slowest rank's time, so that all stop after the same step."""
        limit = self.cfg.probe.max_seconds
        if not self.probing or limit is None or self.state.step <= self.cfg.perf.warmup_steps:
            return False
        return all_reduce([time.monotonic() - started], "max")[0] >= limit

    def _report_to_trial(self, step: int) -> None:
        """An Optuna trial with a pruner: report this evaluation; every rank stops when the pruner says so."""
        if self.trial_link is None:
            return
        pruned = self.trial_reporter is not None and self.trial_reporter.report(self.state.last_eval, step)
        if all_reduce([1.0 if pruned else 0.0], "max")[0]:
            objective = self.trial_link.objective
            raise RunPruned(f"the {self.trial_link.pruner} pruner stopped trial {self.trial_link.trial_number} at "
                            f"step {step} of {self.cfg.train.max_steps} ({objective} = "
                            f"{self.state.last_eval.get(objective)})")

    def _log(self, record: dict[str, Any]) -> None:
        if self.metrics_log is not None:
            self.metrics_log.append(record)
        if self.tracker is not None:
            self.tracker.log(record, step=record["step"])

    def final_metrics(self) -> dict[str, Any]:
        """summary.json metrics (train/final_metrics.py; collective), with how the rows were laid out."""
        metrics = final_metrics(self.cfg, self.plan, self.built, self.state, self.perf, device=self.device,
                                world_size=self.env.world_size, probing=self.probing, is_main=self.env.is_main)
        return {**metrics, **self.layout_metrics()}

    def layout_metrics(self) -> dict[str, Any]:
        """perf/padding_fraction: the share of the positions the training micro-batches computed (rows x
        width, all ranks) that were padding; perf/attention: the attention path the rows ran through
        (collective)."""
        computed, padding = all_reduce([float(self.computed_positions), float(self.padding_positions)])
        train = self.cfg.train
        return {"perf/padding_fraction": padding / computed if computed else None,
                "perf/attention": attention_path(self.built.policy, dense_mask=train.share_prompt or train.packing)}

    # ------------------------------------------------------------------ checkpoints
    def _resume_from_checkpoint(self) -> None:
        """Continue from the run directory's latest complete checkpoint, if any (see checkpoint.py).

        metrics.jsonl keeps the records up to that step; the ones after it are logged again.
        """
        info = self.checkpointer.find_resumable()
        if info is not None:
            saved = self.checkpointer.load(info, self.built.policy, self.built.optimizer,
                                           reference=self._moving_reference())
            self.built.scheduler.load_state_dict(saved["scheduler"])
            self.built.scaler.load_state_dict(saved["scaler"])
            self.state = TrainState(step=saved["step"], last_train=saved["last_train"], last_eval=saved["last_eval"],
                                    zero_shot=saved.get("zero_shot", {}))  # absent from older checkpoints
            self.resumed_from = info.step
            if self.env.is_main:
                log.info("resumed from %s at step %d of %d", info.path, info.step, self.cfg.train.max_steps)
        if self.metrics_log is not None:
            self.metrics_log.truncate_after(self.state.step)
        if self.eval_pairs_log is not None:
            self.eval_pairs_log.truncate_after(self.state.step)

    def save_checkpoint(self) -> Path:
        """Checkpoint the training state after the current step (collective)."""
        step, built = self.state.step, self.built
        self.heartbeat(step, "checkpoint")
        train_state = {
            "data_position": {"step": step, "pairs_consumed": step * self.cfg.train.batch_size},
            "scheduler": built.scheduler.state_dict(),
            "scaler": built.scaler.state_dict(),
            "last_train": self.state.last_train,
            "last_eval": self.state.last_eval,
            "zero_shot": self.state.zero_shot,
        }
        fault = fault_in_checkpoint(self.cfg.faults, step, self.env.rank, self.resumed_from is not None)
        return self.checkpointer.save(step, built.policy, built.optimizer, train_state, before_commit=fault,
                                      reference=self._moving_reference())

    def _moving_reference(self) -> torch.nn.Module | None:
        """A full fine-tune's reference model that TR-DPO moves: checkpointed with the policy. (An adapter
        run's moving reference is an adapter of the policy, checkpointed with it.)"""
        reference = self.built.reference
        moving = self.cfg.train.reference_sync.every_steps > 0 and isinstance(reference, torch.nn.Module)
        return reference if moving else None

    def _checkpoint_or_stop(self) -> None:
        """Between steps: the periodic checkpoint; on a stop signal or the time limit, a checkpoint and a stop."""
        step, max_steps = self.state.step, self.cfg.train.max_steps
        reason = self.stop_requests.agreed_reason(self.env.world_size) if step < max_steps else 0
        if self.checkpointer.due(step) or (reason and step != self.checkpointer.last_saved_step):
            self.save_checkpoint()
        if reason:
            raise RunInterrupted(
                f"{self.stop_requests.describe(reason)}: stopped after step {step} of {max_steps} with a checkpoint "
                f"in {self.checkpointer.folder}/step_{step}; the same command in the same run directory resumes it",
                kind=self.stop_requests.failure_kind(reason), step=step, reason=reason)

    # ------------------------------------------------------------------ save
    def save_model(self) -> Path | None:
        """The policy in Hugging Face format (full state dict gathered to rank 0), with its tokenizer."""
        self.heartbeat(self.state.step, "save_model")
        built = self.built
        path = save_model(built.policy, built.tokenizer, self.ctx.run_dir, self.env.is_main,
                          base_name=self.cfg.model.name_or_path, merged=self.cfg.train.save_merged)
        train = self.cfg.train
        if train.sample_prompts and not self.probing:
            if self.env.is_main:
                prompts = [pair.prompt for pair in built.eval_pairs[: train.sample_prompts]]
                write_samples(self.ctx.run_dir, self.cfg.model, built.tokenizer, prompts, train.sample_max_new_tokens,
                              train.seed, built.end_of_turn, progress=lambda: self.heartbeat(self.state.step, "samples"))
            all_reduce([0.0])  # the other ranks wait for rank 0's samples
        return path

    def broken_checkpoints(self) -> list[str]:
        """summary.json's broken_checkpoints: those skipped at resume (empty: none)."""
        return list(self.checkpointer.broken)

    def close(self, summary: Summary) -> Summary:
        """The trackers' end, once summary.json is written (tracking/tracker.py)."""
        tracker, self.tracker = self.tracker, None
        return tracker.finish(summary) if tracker is not None else summary



def _pair_scores(idx: list[int], stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """One pass's per-pair scores for eval_pairs.parquet, a float64 row per pair in GATHERED's order; NaN for
    the reference of a loss without one. `correct` is the very value eval/rewards/accuracies averages."""
    nan = torch.full((len(idx),), math.nan, dtype=torch.float64)
    columns = {
        "pair_index": torch.tensor(idx, dtype=torch.float64),
        "policy_chosen_logps": stats["logps/chosen"], "policy_rejected_logps": stats["logps/rejected"],
        "reference_chosen_logps": stats.get("reference/logps/chosen", nan),
        "reference_rejected_logps": stats.get("reference/logps/rejected", nan),
        "correct": stats["rewards/accuracies"],
    }
    return torch.stack([columns[name].detach().double().cpu() for name in GATHERED], 1)
