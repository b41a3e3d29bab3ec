"""A preference task the project generates itself, learnable by a tiny random-init model.

Each prompt names one of `num_topics` topics followed by random filler letters. Every topic likes
a fixed half of the letters a-z (drawn from `seed`). The chosen answer takes each letter from the
liked half with probability `1 - noise`; the rejected answer with probability `noise`. The policy
must learn which letters each topic likes, from preferences alone, and generalise to new held-out
pairs. `noise` sets the difficulty: near 0 the signal is clean, at 0.5 there is none.
"""

from __future__ import annotations

import random
import string

from dpo_sweeps.errors import InvalidConfig

LETTERS = string.ascii_lowercase


def topic_preferences(num_topics: int, seed: int) -> list[str]:
    """The liked half of the alphabet for each topic."""
    rng = random.Random(f"topics-{seed}")
    return ["".join(sorted(rng.sample(LETTERS, len(LETTERS) // 2))) for _ in range(num_topics)]


def generate_pairs(
    count: int,
    *,
    seed: int,
    stream: str,
    num_topics: int,
    prompt_letters: int,
    response_letters: int,
    noise: float,
) -> list[dict[str, str]]:
    """`count` pairs; `stream` ("train" or "eval") draws disjoint random streams from one seed."""
    if not 0.0 <= noise <= 0.5:
        raise InvalidConfig("data.noise", f"got {noise}", "a number in [0, 0.5]; 0 is easiest")
    if num_topics < 1:
        raise InvalidConfig("data.num_topics", f"got {num_topics}", "an integer >= 1")
    liked = topic_preferences(num_topics, seed)
    disliked = ["".join(c for c in LETTERS if c not in ok) for ok in liked]
    rng = random.Random(f"{stream}-{seed}")

    def answer(topic: int, p_liked: float) -> str:
        return " " + "".join(
            rng.choice(liked[topic] if rng.random() < p_liked else disliked[topic])
            for _ in range(response_letters)
        )

    pairs = []
    for _ in range(count):
        topic = rng.randrange(num_topics)
        filler = "".join(rng.choice(LETTERS) for _ in range(prompt_letters))
        prompt = f"topic {topic}: {filler}\nanswer:"
        pairs.append({"prompt": prompt, "chosen": answer(topic, 1 - noise), "rejected": answer(topic, noise)})
    return pairs
