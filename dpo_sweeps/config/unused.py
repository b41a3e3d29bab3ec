"""Settings given on the command line that the chosen config would not read: refused, never ignored.

The schema refuses a key no config has (`train.lr_rate`); this table holds the keys that exist but
act only beside another choice (`fsdp.hybrid_group_size` only with `fsdp=hybrid_shard`). A setting
is refused only when the user set it (`overrides`): the files in conf/ carry every key with a value.
A sweep's setting may act at some of its points only (`fsdp=full_shard,hybrid_shard
fsdp.hybrid_group_size=2`): it is refused only when no point reads it (`SettingsRead`, fed each point
by the sweep's pre-launch check, launchers/preflight.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import InvalidConfig

SYNTHETIC_OWN_SPLIT = "the synthetic task generates its own train and eval pairs"


@dataclass(frozen=True)
class UsedOnlyWhen:
    keys: tuple[str, ...]
    unused: Callable[[Config], bool]  # true: the chosen config does not read these keys
    why: str  # why not, for the message
    instead: str  # what would make them act, or what acts instead


def _local_path(cfg: Config) -> bool:
    from dpo_sweeps.data.sources import looks_local

    path = cfg.data.path
    return bool(path) and (looks_local(str(path)) or Path(str(path)).expanduser().exists())


def _nll_unused(cfg: Config) -> bool:
    return getattr(cfg.loss, "sft_weight", None) == 0  # a loss without sft_weight has no nll_average either


RULES = (
    UsedOnlyWhen(("fsdp.hybrid_group_size",), lambda c: c.fsdp.sharding_strategy != "hybrid_shard",
                 "only hybrid_shard has shard groups", "fsdp=hybrid_shard"),
    UsedOnlyWhen(("precision.initial_loss_scale", "precision.loss_scale_growth_interval"),
                 lambda c: not c.precision.loss_scaling, "they act only with loss scaling",
                 "precision=fp16, or precision.loss_scaling=true"),
    UsedOnlyWhen(("model.tokenizer.vocab_size",), lambda c: c.model.tokenizer.kind != "bpe",
                 "only a trained BPE has a vocabulary size to choose", "model.tokenizer.kind=bpe"),
    UsedOnlyWhen(("data.length_group_window",), lambda c: not c.data.length_grouped,
                 "windows group pairs by length only with data.length_grouped", "data.length_grouped=true"),
    UsedOnlyWhen(("data.data_dir",), _local_path, "a local data.path has no subset folders of a hub dataset",
                 "a hub dataset name in data.path, or the subset's own folder as data.path"),
    UsedOnlyWhen(("data.split", "data.eval_split", "data.eval_size", "data.split_seed", "data.max_pairs"),
                 lambda c: c.data.name == "synthetic", SYNTHETIC_OWN_SPLIT,
                 "data.num_train_pairs and data.num_eval_pairs"),
    UsedOnlyWhen(("loss.f_alpha_divergence_coef",), lambda c: c.loss.f_divergence != "alpha_divergence",
                 "it is alpha_divergence's alpha", "loss.f_divergence=alpha_divergence"),
    UsedOnlyWhen(("loss.nll_average",), _nll_unused, "there is no NLL term at loss.sft_weight=0",
                 "loss.sft_weight > 0"),
    UsedOnlyWhen(("wandb.project", "wandb.entity", "wandb.group"), lambda c: c.wandb.mode == "disabled",
                 "nothing is logged to W&B with wandb.mode=disabled", "wandb.mode=offline or online"),
    UsedOnlyWhen(("faults.step", "faults.rank"), lambda c: c.faults.kind in (None, "null"),
                 "no fault is injected with faults.kind=null", "faults.kind=crash (or another kind)"),
)
RULE_OF = {key: rule for rule in RULES for key in rule.keys}


def override_key(override: str) -> str | None:
    """The dotted key an override sets (`+a.b=1` -> a.b); None for group choices and Hydra's own keys."""
    key = override.split("=", 1)[0].lstrip("+~").strip()
    if "." not in key or "/" in key or key.startswith("hydra.") or "@" in key:
        return None
    return key


def given_keys(overrides: list[str]) -> set[str]:
    """The keys `overrides` set that a rule governs."""
    return {k for k in (override_key(o) for o in overrides if "=" in o) if k in RULE_OF}


def unread(key: str, where: str) -> InvalidConfig:
    """The refusal of `key`, set but not read `where`."""
    rule = RULE_OF[key]
    return InvalidConfig(key, f"set, but not read {where}: {rule.why}", f"{rule.instead}; or leave {key} out")


def check_settings_used(cfg: Config, overrides: list[str]) -> None:
    """Raise InvalidConfig for the first setting in `overrides` the chosen config would not read."""
    given = given_keys(overrides)
    for rule in RULES:
        for key in rule.keys:
            if key in given and rule.unused(cfg):
                raise unread(key, "here")


class SettingsRead:
    """For a sweep: the governed settings its points give that no point has read yet. Each point's
    config is looked at only while one of its given keys is still unread, so a sweep of thousands of
    points that reads its settings at the first pays for one point."""

    def __init__(self) -> None:
        self.unread: dict[str, int] = {}  # key -> points that give it without reading it
        self.read: set[str] = set()

    def add(self, overrides: list[str], config: Callable[[], Config]) -> None:
        pending = given_keys(overrides) - self.read
        if not pending:
            return
        cfg = config()
        for key in pending:
            if RULE_OF[key].unused(cfg):
                self.unread[key] = self.unread.get(key, 0) + 1
            else:
                self.read.add(key)
                self.unread.pop(key, None)

    def check(self) -> None:
        """Raise InvalidConfig for the first setting given at some points and read at none."""
        for key, points in self.unread.items():
            where = "at the sweep's only point" if points == 1 else f"at any of the {points} points that set it"
            raise unread(key, where)
