"""A micro-batch of encoded pairs as model inputs: token tensors, labels and where each response
token is scored (the two row layouts of train.share_prompt)."""

from __future__ import annotations

import torch

from dpo_sweeps.data.encoding import IGNORE_INDEX, EncodedPair


def collate(pairs: list[EncodedPair], pad_id: int, *, share_prompt: bool = False) -> dict[str, torch.Tensor]:
    """One micro-batch of pairs as model inputs, right-padded, plus where each response token is scored.

    Rows hold chosen then rejected ([2B, L], `labels` mask prompt and padding), or with `share_prompt`
    one row per pair, prompt + chosen + rejected ([B, L'], see `collate_shared_prompt`). Either way
    `token_rows`/`token_positions` index the hidden state that predicts each response token,
    `token_targets` is that token and `token_sequences` the sequence it counts for (chosen i: i,
    rejected i: B + i); `num_tokens` counts the non-padding tokens of the [2B, L] form (what tokens/s
    counts, whatever the layout), `num_row_tokens` those the rows hold (the prompt once where it is shared)
    and `num_pairs` the pairs. Packed rows (train.packing) are data/packing.py's.
    """
    if share_prompt:
        return collate_shared_prompt(pairs, pad_id)
    sequences, label_rows = [], []
    for response_of in (lambda p: p.chosen, lambda p: p.rejected):
        for pair in pairs:
            response = response_of(pair)
            sequences.append(pair.prompt + response)
            label_rows.append([IGNORE_INDEX] * len(pair.prompt) + response)
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, (seq, lab) in enumerate(zip(sequences, label_rows)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(seq)] = 1
    # Position t predicts token t + 1.
    rows, positions = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
             "token_rows": rows, "token_positions": positions, "token_targets": labels[rows, positions + 1],
             "token_sequences": rows, "num_tokens": attention_mask.sum(), "num_row_tokens": attention_mask.sum(),
             "num_pairs": torch.tensor(len(pairs))}
    return with_reference_logps(batch, pairs)


def collate_shared_prompt(pairs: list[EncodedPair], pad_id: int) -> dict[str, torch.Tensor]:
    """Prefix sharing: each pair is one row, prompt + chosen + rejected, scored in one pass.

    The rejected tokens attend to the prompt and to themselves, never to the chosen ones, and take the
    positions that follow the prompt (position_ids restart), so every response token sees exactly the
    context it has in the [2B, L] form while the prompt is computed once (Wang et al. 2024, "Accelerating
    Direct Preference Optimization with Prefix Sharing", arXiv 2410.20305). The attention mask is a 4-D
    boolean [B, 1, L, L] (True: may attend); padding queries attend to position 0 only, so no row is empty.
    """
    b = len(pairs)
    width = max(len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, 1, width, width), dtype=torch.bool)
    mask[:, :, :, 0] = True
    rows, positions, targets, sequences = [], [], [], []
    num_tokens = num_row_tokens = 0
    for i, pair in enumerate(pairs):
        p, c, r = len(pair.prompt), len(pair.chosen), len(pair.rejected)
        n = p + c + r
        input_ids[i, :n] = torch.tensor(pair.prompt + pair.chosen + pair.rejected)
        position_ids[i, : p + c] = torch.arange(p + c)
        position_ids[i, p + c : n] = torch.arange(p, p + r)
        causal = torch.ones((n, n), dtype=torch.bool).tril_()
        causal[p + c :, p : p + c] = False
        mask[i, 0, :n, :n] = causal
        # Chosen token k is predicted at p - 1 + k; rejected token 0 also at p - 1 (the prompt's last
        # token), rejected token k > 0 at the previous rejected token, p + c + k - 1.
        rows += [i] * (c + r)
        positions += list(range(p - 1, p + c - 1)) + [p - 1] + list(range(p + c, n - 1))
        targets += pair.chosen + pair.rejected
        sequences += [i] * c + [b + i] * r
        num_tokens += 2 * p + c + r
        num_row_tokens += n
    batch = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids,
             "token_rows": torch.tensor(rows), "token_positions": torch.tensor(positions),
             "token_targets": torch.tensor(targets), "token_sequences": torch.tensor(sequences),
             "num_tokens": torch.tensor(num_tokens), "num_row_tokens": torch.tensor(num_row_tokens),
             "num_pairs": torch.tensor(b)}
    return with_reference_logps(batch, pairs)


def with_reference_logps(batch: dict[str, torch.Tensor], pairs: list[EncodedPair]) -> dict[str, torch.Tensor]:
    """Add `reference_logps` [2B] (chosen then rejected) when every pair carries precomputed ones."""
    if pairs and all(p.reference_logps is not None for p in pairs):
        batch["reference_logps"] = torch.tensor(
            [p.reference_logps[0] for p in pairs] + [p.reference_logps[1] for p in pairs], dtype=torch.float32
        )
    return batch
