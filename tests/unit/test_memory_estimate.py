"""The memory estimate's CPU terms on a SmolLM2-shaped model (dpo_sweeps/parallel/memory_estimate.py)."""

from __future__ import annotations

import dataclasses

from dpo_sweeps.parallel.memory_estimate import (
    CPU_RUNTIME,
    MMAP_THRESHOLD_MAX,
    ModelShape,
    RunShape,
    activations,
    estimate_peak_memory,
    gathered_params,
    heap_kept,
    logits,
    tcmalloc_kept,
)

# SmolLM2-135M: 30 Llama blocks of 576, a 49,152-token vocabulary with tied embeddings.
SMOLLM2 = ModelShape(num_params=134_515_008, num_layers=30, hidden=576, intermediate=1536, vocab=49152)
BLOCKS = SMOLLM2.num_layers * SMOLLM2.block_params
# full_shard on 2 CPU ranks, fp32, 4 pairs of 34 tokens a micro-batch (the bench's synthetic rows).
FULL_SHARD = RunShape(shard_group_size=2, param_dtype="float32", optimizer="adamw", micro_batch_size=4, seq_len=34,
                      precompute_reference_logps=True, logps_chunk_size=1024, share_prompt=True)


def test_the_embedding_is_mmapped_so_only_the_blocks_buffers_stay_in_the_heap():
    # The 49,152 x 576 embedding is over glibc's mmap ceiling in fp32 and in bf16; one block is not.
    assert 2 * SMOLLM2.root_params >= MMAP_THRESHOLD_MAX > 4 * SMOLLM2.block_params
    # AdamW's fp32 temporary of a block shard; then per block: forward's and backward's split gathers,
    # the unsharded gradients and the unsharded parameters freed in backward.
    assert heap_kept(SMOLLM2, FULL_SHARD) == 4 * BLOCKS // 2 + 4 * 4 * BLOCKS


def test_the_kept_buffers_are_in_the_compute_dtype_not_the_reduce_dtype():
    bf16 = dataclasses.replace(FULL_SHARD, param_dtype="bfloat16", reduce_dtype="float32")
    assert heap_kept(SMOLLM2, bf16) == 4 * BLOCKS // 2 + 4 * 2 * BLOCKS  # the fp32 optimizer temporary stays


def test_fewer_gathers_are_split_when_kept_gathered_checkpointed_in_bf16_or_unsharded():
    full = heap_kept(SMOLLM2, FULL_SHARD)
    kept_gathered = dataclasses.replace(FULL_SHARD, reshard_after_forward=False)
    assert full - heap_kept(SMOLLM2, kept_gathered) == 4 * BLOCKS  # no regather in backward
    # A checkpointed forward's saved block outputs still split an fp32 gather; a casting gather frees its
    # cast shards too, which take them, so the forward splits nothing in bf16.
    checkpointed = dataclasses.replace(FULL_SHARD, activation_checkpointing=True)
    assert heap_kept(SMOLLM2, checkpointed) == full
    bf16 = dataclasses.replace(FULL_SHARD, param_dtype="bfloat16")
    bf16_checkpointed = dataclasses.replace(bf16, activation_checkpointing=True)
    assert heap_kept(SMOLLM2, bf16) - heap_kept(SMOLLM2, bf16_checkpointed) == 2 * BLOCKS
    no_shard = dataclasses.replace(FULL_SHARD, shard_group_size=1, reshard_after_forward=False)
    assert heap_kept(SMOLLM2, no_shard) == 4 * BLOCKS + 2 * 4 * BLOCKS  # nothing gathered: no flat buffer


def test_one_rank_without_fully_shard_has_no_gathered_copies_and_keeps_only_the_optimizer_temporary():
    one_rank = dataclasses.replace(FULL_SHARD, shard_group_size=1, fully_sharded=False)
    assert gathered_params(SMOLLM2, one_rank) == 0 < gathered_params(SMOLLM2, FULL_SHARD)
    assert heap_kept(SMOLLM2, one_rank) == 4 * BLOCKS  # the embedding's temporary is mmapped


def test_one_rank_with_adapters_keeps_its_activations_holes_checkpointed_or_not():
    # With adapters the optimizer's temporary is theirs only: the activations' holes are the larger.
    lora = dataclasses.replace(SMOLLM2, trainable_params=4_884_480)
    one_rank = dataclasses.replace(FULL_SHARD, shard_group_size=1, fully_sharded=False)
    holes = activations(lora, one_rank) + logits(lora, one_rank)
    assert heap_kept(lora, one_rank) == holes > 4 * lora.trainable_params
    # A checkpointed block frees its activations at its end; their holes are kept all the same.
    checkpointed = dataclasses.replace(one_rank, activation_checkpointing=True)
    assert activations(lora, checkpointed) < activations(lora, one_rank)
    assert heap_kept(lora, checkpointed) == holes
    # Twice the pairs, twice the holes; on a wrapped rank the gathers take the activations instead.
    doubled = dataclasses.replace(one_rank, micro_batch_size=8)
    assert heap_kept(lora, doubled) == activations(lora, doubled) + logits(lora, doubled) > holes
    wrapped = dataclasses.replace(one_rank, fully_sharded=True)
    assert heap_kept(lora, wrapped) == heap_kept(lora, dataclasses.replace(wrapped, micro_batch_size=8))


def test_a_small_model_keeps_every_units_buffers_in_the_heap():
    tiny = ModelShape(num_params=4_470_272, num_layers=4, hidden=256, intermediate=1024, vocab=4096)  # bench_gpt2
    p = tiny.root_params + tiny.num_layers * tiny.block_params
    assert heap_kept(tiny, FULL_SHARD) == 4 * tiny.root_params // 2 + 4 * tiny.num_layers * tiny.block_params // 2 \
        + 4 * 4 * p


def test_on_a_cpu_the_heap_term_and_the_runtime_come_on_top_of_the_tensors():
    on_gpu = estimate_peak_memory(SMOLLM2, FULL_SHARD)
    on_cpu = estimate_peak_memory(SMOLLM2, FULL_SHARD, baseline_bytes=333 * 2**20)
    assert on_gpu.heap_kept == 0 and on_gpu.baseline == 0
    assert on_cpu.total == on_gpu.total + 333 * 2**20 + CPU_RUNTIME + heap_kept(SMOLLM2, FULL_SHARD)


def test_under_tcmalloc_the_heap_term_is_tcmallocs_and_smaller_than_glibcs():
    tcmalloc = dataclasses.replace(FULL_SHARD, allocator="tcmalloc")
    # Half an fp32 copy of the blocks and half the optimizer's fp32 temporary of this rank's shard, whatever the
    # dtype, micro-batch or checkpointing; glibc's heap term grows with the split gathers instead.
    kept = 2 * BLOCKS + 2 * SMOLLM2.num_params // 2
    assert heap_kept(SMOLLM2, tcmalloc) == tcmalloc_kept(SMOLLM2, tcmalloc) == kept < heap_kept(SMOLLM2, FULL_SHARD)
    for changed in (dict(param_dtype="bfloat16"), dict(micro_batch_size=16), dict(activation_checkpointing=True)):
        assert heap_kept(SMOLLM2, dataclasses.replace(tcmalloc, **changed)) == kept
    # With adapters the temporary is theirs; one rank fully_shard does not wrap keeps only its half of it.
    lora = dataclasses.replace(SMOLLM2, trainable_params=4_884_480)
    assert heap_kept(lora, tcmalloc) == 2 * BLOCKS + 2 * lora.trainable_params // 2
    one_rank = dataclasses.replace(tcmalloc, shard_group_size=1, fully_sharded=False)
    assert heap_kept(lora, one_rank) == 2 * lora.trainable_params
    assert heap_kept(lora, one_rank) < heap_kept(lora, dataclasses.replace(one_rank, allocator="glibc"))
    on_cpu = estimate_peak_memory(SMOLLM2, tcmalloc, baseline_bytes=333 * 2**20)
    assert on_cpu.total == estimate_peak_memory(SMOLLM2, tcmalloc).total + 333 * 2**20 + CPU_RUNTIME + kept
