"""The training loop's progress: what a checkpoint saves of it and summary.json reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    step: int = 0
    last_train: dict[str, Any] = field(default_factory=dict)
    last_eval: dict[str, Any] = field(default_factory=dict)
    zero_shot: dict[str, Any] = field(default_factory=dict)  # train.zero_shot_eval's baseline, from step 0
