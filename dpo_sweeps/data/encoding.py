"""From preference rows to token batches, as the reference DPO implementation tokenizes.

Prompt and responses are tokenized separately; each response gets EOS appended (or, rendered with a
chat template, ends with the template's end-of-turn token: `ChatFormat`). When prompt plus
the longer response exceed `max_length`, the prompt is cut first to `max_prompt_length` (keeping
its end for dialogues, its start otherwise), then the responses to `max_length - max_prompt_length`.
Prompt tokens carry no loss (label -100). Nothing here loads torch (a sweep validates lengths and
truncation before launch); collate.py turns pairs into tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpo_sweeps.config.data_schema import TRUNCATION_MODES, chat_template_setting, check_lengths
from dpo_sweeps.errors import DataError, InvalidConfig

IGNORE_INDEX = -100


@dataclass(frozen=True)
class EncodedPair:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    # (chosen, rejected) summed log-probs under the frozen reference, when precomputed
    # (train.precompute_reference_logps); None: the reference model scores the pair in each step.
    reference_logps: tuple[float, float] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt) + max(len(self.chosen), len(self.rejected))


def render_messages_plain(messages: list[dict]) -> str:
    """The documented plain rendering for tokenizers without a chat template: "role: content" lines."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


# An HH transcript's turns: "\n\nHuman: ..." and "\n\nAssistant: ...".
HH_TURN = re.compile(r"\n\n(Human|Assistant):")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}
_SENTINEL = "\x00dpo-sweeps-response\x00"


@dataclass(frozen=True)
class ChatFormat:
    """A tokenizer's chat template as pairs are rendered with it (data.chat_template).

    `end_of_turn` is the special token the template closes an assistant turn with (`<|im_end|>` for
    ChatML templates), found by rendering a placeholder reply; a response ends with it instead of EOS.
    None: the template closes a turn with no special token, and EOS is appended as for plain text.
    """

    tokenizer: Any
    end_of_turn: str | None

    @classmethod
    def of(cls, tokenizer) -> ChatFormat:
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
        after = tokenizer.apply_chat_template(probe, tokenize=False).split(_SENTINEL, 1)[-1]
        specials = [str(t) for t in tokenizer.added_tokens_decoder.values() if t.special]
        found = sorted((after.find(t), -len(t), t) for t in specials if t and t in after)
        return cls(tokenizer, found[0][2] if found else None)

    def prompt(self, messages: list[dict]) -> str:
        """The conversation up to where the template opens the assistant's turn."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def response(self, prompt_messages: list[dict], prompt_text: str, messages: list[dict]) -> str:
        """What the template adds after the prompt for `messages`, through their last end-of-turn token."""
        full = self.tokenizer.apply_chat_template(prompt_messages + messages, tokenize=False)
        if not full.startswith(prompt_text):
            raise DataError("data.chat_template: the tokenizer's chat template renders the prompt differently "
                            "once a reply follows, so the reply cannot be cut from it (accepted: "
                            "data.chat_template=false)")
        reply = full[len(prompt_text):]
        if self.end_of_turn is not None and self.end_of_turn in reply:
            reply = reply[: reply.rindex(self.end_of_turn) + len(self.end_of_turn)]
        return reply


def no_chat_template(tokenizer_described: str) -> InvalidConfig:
    return InvalidConfig("data.chat_template", f"true, but {tokenizer_described} has no chat template",
                         "auto or false, or a model whose tokenizer has one (e.g. model=smollm2_135m)")


def chat_format(tokenizer, setting) -> ChatFormat | None:
    """The chat format `data.chat_template` asks for with this tokenizer (None: plain text)."""
    setting = chat_template_setting(setting)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if setting == "true" and not has_template:
        raise no_chat_template("the model's tokenizer")
    return ChatFormat.of(tokenizer) if has_template and setting != "false" else None


def hh_messages(transcript: str) -> list[dict]:
    """An HH prompt ("\n\nHuman: ...\n\nAssistant: ...\n\nAssistant:") as messages, without its open
    last assistant turn."""
    parts = HH_TURN.split(transcript)
    head, turns = parts[0].strip(), list(zip(parts[1::2], parts[2::2]))
    messages = [{"role": HH_ROLES[speaker], "content": text.strip()} for speaker, text in turns]
    if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()
    if head:
        messages.insert(0, {"role": "user", "content": head})
    return messages


def render_pair(row: dict[str, Any], chat: ChatFormat | None = None, *,
                hh_dialogue: bool = False) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) text. With `chat`, message lists and (`hh_dialogue`) HH transcripts
    are rendered with the chat template; plain-text rows stay as they are.

    Plain rendering: the prompt's messages as "role: content\n" lines followed by "assistant:"; each
    response is " " + its first message's content, further messages as "\nrole: content".
    """
    prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
    if chat is not None and hh_dialogue:
        prompt = hh_messages(prompt)
        chosen, rejected = ([{"role": "assistant", "content": str(v).strip()}] for v in (chosen, rejected))
    if isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str):
        return prompt, chosen, rejected
    prompt_msgs = _as_messages(prompt, "user")
    if chat is not None:
        prompt_text = chat.prompt(prompt_msgs)
        return (prompt_text, chat.response(prompt_msgs, prompt_text, _as_messages(chosen, "assistant")),
                chat.response(prompt_msgs, prompt_text, _as_messages(rejected, "assistant")))
    prompt_text = render_messages_plain(prompt_msgs) + "assistant:"

    def plain_response(value) -> str:
        messages = _as_messages(value, "assistant")
        first, rest = messages[0], messages[1:]
        return " " + str(first["content"]) + "".join(f"\n{m['role']}: {m['content']}" for m in rest)

    return prompt_text, plain_response(chosen), plain_response(rejected)


def _as_messages(value, default_role: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return list(value)
    raise DataError(
        f"data: a prompt/chosen/rejected value is neither text nor a list of {{'role', 'content'}} messages: {str(value)[:80]!r}"
    )


def encode_pairs(
    texts: list[tuple[str, str, str]],
    tokenizer,
    *,
    max_length: int,
    max_prompt_length: int,
    truncation_mode: str,
    end_of_turn: str | None = None,
) -> tuple[list[EncodedPair], int]:
    """Encoded pairs and how many of them were truncated. A response that ends with `end_of_turn` (the
    chat template's, ChatFormat.end_of_turn) has its end token already; every other one gets EOS."""
    check_lengths(max_length, max_prompt_length)
    if truncation_mode not in TRUNCATION_MODES:
        raise InvalidConfig("data.truncation_mode", f"got {truncation_mode!r}", ", ".join(TRUNCATION_MODES))
    if not texts:
        return [], 0
    prompts, chosens, rejecteds = (list(column) for column in zip(*texts))
    eos = tokenizer.eos_token_id
    encode = lambda batch: tokenizer(batch, add_special_tokens=False)["input_ids"]  # noqa: E731
    pairs, truncated = [], 0

    def ended(ids: list[int], text: str) -> list[int]:
        return ids if end_of_turn is not None and text.endswith(end_of_turn) else ids + [eos]

    for prompt, chosen, rejected, chosen_text, rejected_text in zip(
            encode(prompts), encode(chosens), encode(rejecteds), chosens, rejecteds):
        chosen, rejected = ended(chosen, chosen_text), ended(rejected, rejected_text)
        cut = False
        if len(prompt) + max(len(chosen), len(rejected)) > max_length:
            cut = len(prompt) > max_prompt_length
            prompt = prompt[-max_prompt_length:] if truncation_mode == "keep_end" else prompt[:max_prompt_length]
        if len(prompt) + max(len(chosen), len(rejected)) > max_length:
            cut = True
            room = max_length - max_prompt_length
            chosen, rejected = chosen[:room], rejected[:room]
        truncated += cut
        pairs.append(EncodedPair(prompt, chosen, rejected))
    return pairs, truncated


def rank_micro_batch_indices(global_indices: list[int], rank: int, world_size: int,
                             micro_batch_size: int) -> list[list[int]]:
    """Rank `rank`'s share of a global batch, in micro-batches: consecutive slices, rank by rank."""
    per_rank = len(global_indices) // world_size
    mine = global_indices[rank * per_rank : (rank + 1) * per_rank]
    return [mine[s : s + micro_batch_size] for s in range(0, per_rank, micro_batch_size)]


@dataclass(frozen=True)
class EvalBatching:
    """How each rank's held-out pairs are cut into no-grad forward passes (train.eval_micro_batch_size):
    at most `max_pairs` pairs a pass (None: no cap), and at most `max_tokens` tokens of padded rows a pass
    (None: no budget)."""

    max_pairs: int | None
    max_tokens: int | None = None


def pair_tokens(pair: EncodedPair, share_prompt: bool) -> int:
    """The tokens a pair's rows take in a batch before padding: one prefix-shared row, or two rows
    (chosen and rejected) as long as the longer."""
    if share_prompt:
        return len(pair.prompt) + len(pair.chosen) + len(pair.rejected)
    return 2 * pair.length


# A held-out pass is padded to its longest pair. Pairs go longest first, and a pass stops taking shorter
# ones once padding would pass this share of its tokens: with a budget of many pairs a pass, one pass
# would otherwise pad short pairs to the longest ones' width (on HH, half its tokens). A pass more costs
# one more gather of the sharded model.
EVAL_PASS_PADDING = 0.125
# Rows up to this many tokens count as this many when a pass's padding is weighed: a pass of short rows
# costs about what its fixed work costs, and splitting it would add a pass for a few tokens.
EVAL_SHORT_ROW = 64


def eval_micro_batch_indices(pair_sizes: list[int], rank: int, world_size: int,
                             batching: EvalBatching) -> list[list[int]]:
    """Rank `rank`'s held-out micro-batches. Pairs go longest first (`pair_sizes`: pair_tokens), dealt
    round-robin a round of `world_size` pairs at a time; a micro-batch is consecutive rounds, as many as
    `batching` allows at its first (longest) pair's size and as keep its padding within
    EVAL_PASS_PADDING (rows shorter than EVAL_SHORT_ROW weighed at that; a round is never split, so a pass
    of one round holds that round's own padding, whatever it is), so that pairs of similar length pass together, shorter ones more to a pass, and
    every rank makes the same passes (each is decided from every rank's sizes). Only the last round is
    padded: an index >= num_pairs is padding (it stands for pair index % num_pairs, the round's first
    pair, so that it is no wider than its pass)."""
    n = len(pair_sizes)
    order = sorted(range(n), key=lambda i: -pair_sizes[i])
    rounds = -(-n // world_size)

    def pair_at(p: int) -> int:  # the pair at place p of the order; past the end, its round's first
        return order[p] if p < n else order[p - p % world_size]

    def weighed(r: int) -> int:  # round r's tokens, short rows counted at EVAL_SHORT_ROW
        return sum(max(EVAL_SHORT_ROW, pair_sizes[pair_at(p)]) for p in range(r * world_size, (r + 1) * world_size))

    batches, start = [], 0
    while start < rounds:
        widest = max(1, pair_sizes[order[start * world_size]])
        take, real = 1, weighed(start)
        while (start + take < rounds and (batching.max_pairs is None or take < batching.max_pairs)
               and (batching.max_tokens is None or (take + 1) * widest <= batching.max_tokens)):
            more = real + weighed(start + take)
            if more < (1 - EVAL_PASS_PADDING) * (take + 1) * world_size * max(widest, EVAL_SHORT_ROW):
                break  # the next round would take the pass's padding past its bound
            real, take = more, take + 1
        positions = [r * world_size + rank for r in range(start, start + take)]
        batches.append([pair_at(p) if p < n else n + pair_at(p) for p in positions])
        start += take
    return batches


class GlobalBatchSampler:
    """Which pairs make global batch `step`: a seeded permutation per epoch, a pure function of step.

    Being stateless in the step number is what makes resuming from a checkpoint exact.

    With `lengths` and `group_window` (length-grouped sampling, `data.length_grouped`), each epoch's
    permutation is cut into windows of `group_window` global batches; a window is sorted by pair length,
    cut into batches of similar length, and those batches are shuffled (seeded by window), so a batch
    carries little padding and long and short batches still alternate at random. The batches stay
    aligned with step boundaries, every epoch still covers every pair once, and the result is still a
    pure function of (seed, step). The same idea as grouping by length in "megabatches" in common
    trainers; a window bounds how far the order departs from a plain shuffle.
    """

    def __init__(self, num_pairs: int, batch_size: int, seed: int, *, lengths: list[int] | None = None,
                 group_window: int = 0):
        if group_window and (lengths is None or len(lengths) != num_pairs):
            raise ValueError("length-grouped sampling needs one length per pair")
        self.num_pairs, self.batch_size, self.seed = num_pairs, batch_size, seed
        self.lengths = np.asarray(lengths) if group_window else None
        self.group_window = group_window
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_pairs)
            if self.group_window:
                perm = self._grouped(perm, epoch)
            # Keep two epochs: a batch that straddles an epoch boundary reads both.
            self._perms = {e: q for e, q in self._perms.items() if abs(e - epoch) == 1} | {epoch: perm}
        return self._perms[epoch]

    def _grouped(self, perm: np.ndarray, epoch: int) -> np.ndarray:
        b, n = self.batch_size, self.num_pairs
        # The first pairs of this epoch finish a batch begun in the previous one: they keep their place.
        head = (-epoch * n) % b
        out = [perm[:head]]
        window = self.group_window * b
        for w, start in enumerate(range(head, n, window)):
            chunk = perm[start : start + window]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            full = len(chunk) // b
            batches = [chunk[i * b : (i + 1) * b] for i in range(full)]
            order = np.random.default_rng([self.seed, epoch, w, 1]).permutation(full)
            out += [batches[i] for i in order]
            out.append(chunk[full * b :])  # a short tail starts the batch that ends in the next epoch
        return np.concatenate(out)

    def indices(self, step: int) -> list[int]:
        start = step * self.batch_size
        return [int(self._perm(p // self.num_pairs)[p % self.num_pairs]) for p in range(start, start + self.batch_size)]
