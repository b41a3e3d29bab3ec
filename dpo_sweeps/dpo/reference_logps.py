"""Reference log-probs computed once before training (`train.precompute_reference_logps`), cached on disk.

DPO's reference model is frozen, so its log-probs of each pair never change: scoring every pair once
and freeing the model takes the reference forward out of every step and the reference weights out of
memory (the same idea as TRL's `precompute_ref_log_probs`).

Each pair is scored in the very micro-batch (same partners, same padding, same rank) in which the
run first trains on it, and each held-out pair in its evaluation micro-batch (eval_micro_batch_indices). The numbers are then
bit for bit the ones the per-step reference pass would have produced, so precomputing changes speed
and memory, never the loss: at step 0 the policy equals the reference and the DPO loss is exactly ln 2.
Only the pairs the run will reach (within `train.max_steps`) are scored.

The cache (`$DPO_SWEEPS_CACHE/reference_logps/`) is keyed by everything that decides those numbers:
the reference weights and model config, the tokenized pairs (data and tokenization), the batch layout
(batch and micro-batch size, ranks, seed, length grouping, steps reached), the scoring path (chunked,
prefix-shared, packed rows and their budget: train/reference_pass.py) and the dtype. Runs of a sweep that differ in beta, loss or sharding strategy share one entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from dpo_sweeps.data.encoding import EncodedPair, EvalBatching, GlobalBatchSampler, rank_micro_batch_indices
from dpo_sweeps.rundir.paths import cache_root

log = logging.getLogger(__name__)

FORMAT = 4  # bump when the way pairs are scored changes (3: held-out passes longest first, eval_batching; 4: a
# held-out pass cut where its padding would pass 1/8, data/encoding.py)


@dataclass(frozen=True)
class BatchLayout:
    """How the run cuts pairs into micro-batches: what decides which partners a pair is scored with."""

    batch_size: int
    micro_batch_size: int
    world_size: int
    max_steps: int
    eval_batching: EvalBatching  # how the held-out pairs are cut into passes (with world_size and the pairs)


@dataclass
class ReferenceLogps:
    train: torch.Tensor  # [num train pairs, 2] fp32 (chosen, rejected); NaN for pairs the run never reaches
    eval: torch.Tensor  # [num eval pairs, 2]
    seconds: float
    source: str  # "computed" or "cache"
    path: Path | None


def first_use_plan(sampler: GlobalBatchSampler,
                   layout: BatchLayout) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """(step, micro-batch j, [(rank, position in the micro-batch, pair index)]) for each micro-batch
    round in which at least one pair is seen for the first time; stops once every pair is seen."""
    seen: set[int] = set()
    plan = []
    for step in range(layout.max_steps):
        if len(seen) == sampler.num_pairs:
            break
        indices = sampler.indices(step)
        per_rank = [rank_micro_batch_indices(indices, r, layout.world_size, layout.micro_batch_size)
                    for r in range(layout.world_size)]
        for j in range(len(per_rank[0])):
            new = []
            for rank in range(layout.world_size):
                for k, i in enumerate(per_rank[rank][j]):
                    if i not in seen:
                        seen.add(i)
                        new.append((rank, k, i))
            if new:
                plan.append((step, j, new))
    return plan


def compute(score: Callable[[list[EncodedPair]], torch.Tensor], train_pairs: list[EncodedPair],
            eval_pairs: list[EncodedPair], sampler: GlobalBatchSampler, layout: BatchLayout, rank: int,
            device: torch.device, eval_batches: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Score every pair the run reaches, each in its first training (or evaluation) micro-batch;
    `eval_batches`: this rank's held-out micro-batches, as the evaluation makes them.

    `score(pairs)` returns the reference's summed log-probs [2B] (chosen then rejected). Every rank
    runs the same number of `score` calls (FSDP forwards are collective); the results are summed
    across ranks, each value coming from the one rank that owns it.
    """
    values = torch.zeros((len(train_pairs), 2), dtype=torch.float64, device=device)
    eval_ = torch.zeros((len(eval_pairs), 2), dtype=torch.float64, device=device)
    reached: list[int] = []
    for step, j, new in first_use_plan(sampler, layout):
        mine = rank_micro_batch_indices(sampler.indices(step), rank, layout.world_size, layout.micro_batch_size)[j]
        logps = score([train_pairs[i] for i in mine]).double()
        reached += [i for _, _, i in new]
        owned = [(k, i) for owner, k, i in new if owner == rank]
        if owned:
            k, i = (torch.tensor(c, device=logps.device) for c in zip(*owned))
            values[i.to(device)] = torch.stack([logps[k], logps[len(mine) + k]], 1).to(device)
    for idx in eval_batches:
        logps = score([eval_pairs[i % len(eval_pairs)] for i in idx]).double()
        real = [(k, i) for k, i in enumerate(idx) if i < len(eval_pairs)]
        if real:
            k, i = (torch.tensor(c, device=logps.device) for c in zip(*real))
            eval_[i.to(device)] = torch.stack([logps[k], logps[len(idx) + k]], 1).to(device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
        dist.all_reduce(eval_)
    train = torch.full((len(train_pairs), 2), float("nan"))
    train[reached] = values.cpu()[reached].float()
    return train, eval_.float().cpu()


def weights_digest(model: torch.nn.Module) -> str:
    """Digest of the model's parameters (whole tensors, gathered when sharded: collective) and config."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(model.config.to_json_string(use_diff=False).encode() if hasattr(model, "config") else b"")
    for name, param in model.named_parameters():
        tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def pairs_digest(*splits: list[EncodedPair]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for pairs in splits:
        digest.update(f"split {len(pairs)}".encode())
        for p in pairs:
            digest.update(json.dumps([p.prompt, p.chosen, p.rejected]).encode())
    return digest.hexdigest()


def cache_key(reference: torch.nn.Module, train_pairs: list[EncodedPair], eval_pairs: list[EncodedPair],
              sampler: GlobalBatchSampler, layout: BatchLayout, *, seed: int, scoring: dict) -> dict:
    """What decides the numbers: weights, tokenized pairs, batch layout, scoring path (collective: the
    weights are gathered to be hashed)."""
    steps_reached = len({step for step, _, _ in first_use_plan(sampler, layout)})
    return {
        "format": FORMAT, "reference": weights_digest(reference), "pairs": pairs_digest(train_pairs, eval_pairs),
        # max_steps itself is left out: runs that reach the same pairs share an entry.
        "layout": {**{k: v for k, v in asdict(layout).items() if k != "max_steps"}, "seed": seed,
                   "length_group_window": sampler.group_window, "steps_reached": steps_reached},
        "scoring": {**scoring, "torch": torch.__version__},
    }


def cache_path(key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "reference_logps" / f"{name}.pt"


def _load(path: Path, key: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError):
        return None
    if saved.get("key") != json.dumps(key, sort_keys=True):
        return None
    return saved["train"], saved["eval"]


def _save(path: Path, key: dict, train: torch.Tensor, eval_: torch.Tensor) -> None:
    """Write to a private file, then rename: concurrent runs of a sweep may race to fill the same entry.
    A cache that cannot be written (a read-only or full disk, a file in the way) is skipped, never a failure."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pt")
        os.close(fd)
        torch.save({"key": json.dumps(key, sort_keys=True), "train": train, "eval": eval_}, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
        log.warning("could not cache reference log-probs at %s (%s); not cached (DPO_SWEEPS_CACHE moves the cache)",
                    path, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def load_or_compute(score: Callable[[list[EncodedPair]], torch.Tensor], key: dict, train_pairs: list[EncodedPair],
                    eval_pairs: list[EncodedPair], sampler: GlobalBatchSampler, layout: BatchLayout, rank: int,
                    device: torch.device, eval_batches: list[list[int]], use_cache: bool = True) -> ReferenceLogps:
    """Rank 0 reads the cache and every rank follows its decision; a miss is computed by all ranks."""
    start = time.perf_counter()
    path = cache_path(key) if use_cache else None
    found = _load(path, key) if path is not None and rank == 0 and path.exists() else None
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        flag = torch.tensor([1.0 if found is not None else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        hit = bool(flag.item())
    else:
        hit = found is not None
    if hit:
        if world > 1:  # rank 0's values reach the others (a multi-node cache folder need not be shared)
            both = torch.cat(found) if found is not None else torch.zeros(len(train_pairs) + len(eval_pairs), 2)
            both = both.to(device)
            dist.broadcast(both, src=0)
            found = (both[: len(train_pairs)].cpu(), both[len(train_pairs):].cpu())
        train, eval_ = found
        return ReferenceLogps(train, eval_, time.perf_counter() - start, "cache", path)
    train, eval_ = compute(score, train_pairs, eval_pairs, sampler, layout, rank, device, eval_batches)
    if path is not None and rank == 0:
        _save(path, key, train, eval_)
    return ReferenceLogps(train, eval_, time.perf_counter() - start, "computed", path)


def placeholder(num_train: int, num_eval: int) -> ReferenceLogps:
    """Zeros for every pair, for probes (probe.py): a step's speed and memory do not depend on the values."""
    return ReferenceLogps(torch.zeros(num_train, 2), torch.zeros(num_eval, 2), 0.0, "not scored (probe)", None)


def attach(pairs: list[EncodedPair], values: torch.Tensor) -> list[EncodedPair]:
    """The pairs with their reference log-probs; pairs the run never reaches keep None."""
    out = []
    for pair, (chosen, rejected) in zip(pairs, values.tolist()):
        known = chosen == chosen and rejected == rejected  # not NaN
        out.append(replace(pair, reference_logps=(chosen, rejected)) if known else pair)
    return out
