"""Greedy replies to the first held-out prompts, from the model before and after training.

With train.sample_prompts = N > 0, rank 0 writes <run dir>/samples.json once the final model is saved:
for each of the first N held-out prompts (as the run tokenized them, chat template included), the
greedy reply of the starting weights (`before`) and of the saved model (`after`), up to
train.sample_max_new_tokens tokens or the end of the turn. analysis/report.py shows them side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from dpo_sweeps.models.build import build_policy
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.paths import saved_model_path

SAMPLES_FILE = "samples.json"


def write_samples(run_dir: Path, model_cfg, tokenizer, prompts: list[list[int]], max_new_tokens: int, seed: int,
                  end_of_turn: str | None = None, progress: Callable[[], None] = lambda: None) -> Path:
    """samples.json: {"max_new_tokens", "samples": [{"prompt", "before", "after"}, ...]}."""
    from transformers import AutoModelForCausalLM

    stops = [tokenizer.eos_token_id]
    if end_of_turn is not None:
        stops.append(tokenizer.convert_tokens_to_ids(end_of_turn))
    replies = {}
    for label, load in (("before", lambda: build_policy(model_cfg, tokenizer, seed)),
                        ("after", lambda: AutoModelForCausalLM.from_pretrained(saved_model_path(run_dir),
                                                                               dtype=torch.float32))):
        model = load().eval()
        replies[label] = [greedy_reply(model, tokenizer, prompt, max_new_tokens, stops, progress) for prompt in prompts]
        del model
    samples = [{"prompt": tokenizer.decode(prompt), "before": before, "after": after}
               for prompt, before, after in zip(prompts, replies["before"], replies["after"])]
    path = Path(run_dir) / SAMPLES_FILE
    write_json_atomic(path, {"max_new_tokens": max_new_tokens, "samples": samples})
    return path


@torch.no_grad()
def greedy_reply(model, tokenizer, prompt: list[int], max_new_tokens: int, stops: list[int],
                 progress: Callable[[], None] = lambda: None) -> str:
    progress()
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True).strip()

