"""The reference model's log-probs of every pair, scored once before training
(train.precompute_reference_logps), and the reference model freed after.

The numbers are cached (dpo/reference_logps.py) and attached to the pairs; the steps then need no
reference forward, and the steps' peak memory holds no reference model.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from dpo_sweeps.config.schema import Config
from dpo_sweeps.data.encoding import EncodedPair, EvalBatching
from dpo_sweeps.dpo import reference_logps
from dpo_sweeps.dpo.losses import ld_alpha_of
from dpo_sweeps.models.quantize import quantization_settings
from dpo_sweeps.parallel.rank_env import RankEnv
from dpo_sweeps.runtime.signals import RunInterrupted, StopRequests
from dpo_sweeps.train.phase_progress import PhaseProgress
from dpo_sweeps.train.scoring import batch_logps, batch_to, collate_pairs

log = logging.getLogger(__name__)


def precompute_reference_logps(data: Any, reference: torch.nn.Module, cfg: Config, env: RankEnv,
                               device: torch.device, probing: bool, stop_requests: StopRequests,
                               eval_batching: EvalBatching, eval_batches: list[list[int]]) -> float:
    """Score every pair under the reference once and attach the numbers to `data`'s pairs (a
    train/setup.py TrainingData), the held-out ones in this rank's eval passes (`eval_batches`, cut as
    `eval_batching` says), laid out as the steps lay them out (padded or packed: train/scoring.py);
    returns the seconds it took. The caller then frees the reference."""
    share_prompt = cfg.train.share_prompt
    # Packed rows score the same pairs to float rounding, not bit for bit: a packed run's entry is its own
    # (and unpacked runs keep the keys their entries were written under).
    packing = {"packing": True, "micro_batch_tokens": cfg.train.micro_batch_tokens} if cfg.train.packing else {}
    layout = reference_logps.BatchLayout(cfg.train.batch_size, cfg.train.micro_batch_size, env.world_size,
                                         cfg.train.max_steps, eval_batching)
    key = reference_logps.cache_key(
        reference, data.train_pairs, data.eval_pairs, data.sampler, layout, seed=cfg.train.seed,
        scoring={"logps_chunk_size": cfg.train.logps_chunk_size, "share_prompt": share_prompt,
                 "param_dtype": cfg.precision.param_dtype, "device": device.type,
                 "ld_alpha": ld_alpha_of(cfg.loss), "quantization": quantization_settings(cfg.peft), **packing},
    ) if not probing else {}
    if probing:  # the values cannot change a step's speed or memory: skip the scoring pass
        found = reference_logps.placeholder(len(data.train_pairs), len(data.eval_pairs))
    else:
        # Every rank makes the same calls with as many pairs: rank 0's count times the ranks is the run's.
        passes = len(list(reference_logps.first_use_plan(data.sampler, layout)))
        total = env.world_size * (passes * cfg.train.micro_batch_size + sum(map(len, eval_batches)))
        progress = PhaseProgress("reference log-probs", total, "pairs", enabled=env.is_main)

        def score(pairs: list[EncodedPair]) -> torch.Tensor:
            found = reference_batch_logps(reference, pairs, data.tokenizer, cfg, device, stop_requests, env.world_size)
            progress.advance(env.world_size * len(pairs))
            return found

        found = reference_logps.load_or_compute(score, key, data.train_pairs, data.eval_pairs, data.sampler,
                                                layout, env.rank, device, eval_batches)
    data.train_pairs = reference_logps.attach(data.train_pairs, found.train)
    data.eval_pairs = reference_logps.attach(data.eval_pairs, found.eval)
    if env.is_main:
        log.info("reference log-probs: %s for %d train and %d eval pairs in %.1fs (%s); reference model freed",
                 found.source, int((~found.train.isnan().any(1)).sum()), len(data.eval_pairs), found.seconds,
                 found.path)
    return found.seconds


@torch.no_grad()
def reference_batch_logps(reference: torch.nn.Module, pairs: list[EncodedPair], tokenizer: Any, cfg: Config,
                          device: torch.device, stop_requests: StopRequests, world_size: int) -> torch.Tensor:
    """The reference's log-probs of some pairs, scored as a step scores them (precomputed reference).

    The pass before training can take minutes on a real model, so a stop signal is honoured between its
    micro-batches too (every rank makes the same calls, so the agreement is collective like a step's).
    """
    reason = stop_requests.agreed_reason(world_size)
    if reason:
        raise RunInterrupted(
            f"{stop_requests.describe(reason)}: stopped while scoring the reference log-probs, before "
            f"training (re)started; the same command in the same run directory starts it again",
            kind=stop_requests.failure_kind(reason), step=0, reason=reason)
    batch = batch_to(collate_pairs(pairs, tokenizer, cfg), device)
    return batch_logps(reference, batch, cfg)[0]


def free_reference(device: torch.device) -> None:
    """Free the reference model once the caller has dropped its last name, its log-probs being all the run
    needs from it.

    FSDP's hooks and the bound scoring method (response_logps.py) hold a model in reference cycles,
    so dropping the last name frees nothing until a full garbage collection: collect now, so that
    the steps' peak memory holds no reference model (as memory_estimate.py counts it).
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
