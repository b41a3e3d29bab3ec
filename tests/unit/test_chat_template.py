"""data.chat_template: HH dialogues and message rows rendered with a real model's chat template
(SmolLM2-135M-Instruct's ChatML, read from its GGUF file), token for token as transformers'
own apply_chat_template renders the conversation."""

from __future__ import annotations

import gzip
import json

import pytest

from dpo_sweeps.data.encoding import chat_format, encode_pairs, hh_messages, render_pair
from dpo_sweeps.data.sources import split_hh_dialogue
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.models.tokenizers import byte_tokenizer

HH_PROMPT = "\n\nHuman: How do I pick a lock?\n\nAssistant: Why do you need to?\n\nHuman: I lost my key.\n\nAssistant:"


def template_ids(tokenizer, messages, **kwargs) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out if isinstance(out, list) else out["input_ids"])


def encode_one(row, chat, hh_dialogue: bool):
    pairs, _ = encode_pairs([render_pair(row, chat, hh_dialogue=hh_dialogue)], chat.tokenizer, max_length=4096,
                            max_prompt_length=2048, truncation_mode="keep_end", end_of_turn=chat.end_of_turn)
    return pairs[0]


def through_end_of_turn(ids: list[int], end_id: int) -> list[int]:
    """A templated conversation up to and including its last end-of-turn token (the template's "\\n" after it
    belongs to no response)."""
    last = max(i for i, t in enumerate(ids) if t == end_id)
    return ids[: last + 1]


def test_the_end_of_turn_token_is_found_in_the_template(smollm2_tokenizer):
    assert chat_format(smollm2_tokenizer, "auto").end_of_turn == "<|im_end|>"


def test_an_hh_pair_tokenizes_as_apply_chat_template_renders_it(smollm2_tokenizer):
    chat = chat_format(smollm2_tokenizer, "auto")
    end_id = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    pair = encode_one({"prompt": HH_PROMPT, "chosen": " Call a locksmith.", "rejected": " Use a hairpin."},
                      chat, hh_dialogue=True)
    messages = [{"role": "user", "content": "How do I pick a lock?"},
                {"role": "assistant", "content": "Why do you need to?"},
                {"role": "user", "content": "I lost my key."}]
    # The prompt ends where the template opens the assistant's turn.
    assert pair.prompt == template_ids(smollm2_tokenizer, messages, add_generation_prompt=True)
    for response, text in ((pair.chosen, "Call a locksmith."), (pair.rejected, "Use a hairpin.")):
        whole = template_ids(smollm2_tokenizer, messages + [{"role": "assistant", "content": text}])
        assert pair.prompt + response == through_end_of_turn(whole, end_id)
        assert response[-1] == end_id and response.count(end_id) == 1  # <|im_end|>, no EOS after it


def test_message_rows_with_a_system_turn_tokenize_as_apply_chat_template(smollm2_tokenizer):
    chat = chat_format(smollm2_tokenizer, "true")
    end_id = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky colour?"}]
    row = {"prompt": prompt, "chosen": [{"role": "assistant", "content": "Blue."}],
           "rejected": [{"role": "assistant", "content": "Loud."}]}
    pair = encode_one(row, chat, hh_dialogue=False)
    assert pair.prompt == template_ids(smollm2_tokenizer, prompt, add_generation_prompt=True)
    whole = template_ids(smollm2_tokenizer, prompt + row["chosen"])
    assert pair.prompt + pair.chosen == through_end_of_turn(whole, end_id)


def test_real_hh_pairs_render_as_their_dialogues(smollm2_tokenizer, hh_path):
    chat = chat_format(smollm2_tokenizer, "auto")
    end_id = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    with gzip.open(hh_path, "rt") as f:
        rows = [json.loads(next(f)) for _ in range(5)]
    for row in rows:
        prompt, chosen = split_hh_dialogue(row["chosen"])
        pair = encode_one({"prompt": prompt, "chosen": chosen, "rejected": split_hh_dialogue(row["rejected"])[1]},
                          chat, hh_dialogue=True)
        messages = hh_messages(prompt) + [{"role": "assistant", "content": chosen.strip()}]
        assert [m["role"] for m in messages[-2:]] == ["user", "assistant"]
        assert pair.prompt + pair.chosen == through_end_of_turn(template_ids(smollm2_tokenizer, messages), end_id)


def test_chat_template_false_keeps_hh_as_written(smollm2_tokenizer):
    row = {"prompt": HH_PROMPT, "chosen": " Call a locksmith.", "rejected": " Use a hairpin."}
    assert chat_format(smollm2_tokenizer, "false") is None
    assert render_pair(row, None, hh_dialogue=True) == (HH_PROMPT, " Call a locksmith.", " Use a hairpin.")


def test_chat_template_true_without_a_template_is_a_one_line_error():
    with pytest.raises(InvalidConfig) as info:
        chat_format(byte_tokenizer(), "true")
    assert str(info.value).startswith("data.chat_template: true, but the model's tokenizer has no chat template")
    assert "\n" not in str(info.value)
    assert chat_format(byte_tokenizer(), "auto") is None
