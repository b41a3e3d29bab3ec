"""Run `python -m dpo_sweeps` recording which config keys the run reads (tests only).

    python tests/support/read_recorder.py OUT.json -- OVERRIDES... [-- OVERRIDES...]

runs each override list as one run of the real CLI, in this one process (imports paid once), and writes
OUT.json: for each run, its exit code and the sorted config keys it read. A key is read when code asks
the run's config for it (`cfg.train.lr`, `cfg["loss"]["beta"]`, `.get`), on the DictConfig the ranks
use or the plain dict of `RunContext.config`; bulk copies (hashing, summary.json, `OmegaConf.create`)
are not reads. The checks before training (validate_config, the unread-setting and fit checks) read
every key they check, so recording stops while they run (the fit check of `resources.device_memory_gib`
is recorded: it is what that key is for); what is left is what the run uses.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from omegaconf import DictConfig

READS: set[str] = set()
_paused = [0]


def _record(node: DictConfig, key: Any) -> None:
    if _paused[0] or not isinstance(key, str) or key.startswith("_"):
        return
    _paused[0] += 1  # _get_full_key reads nodes itself
    try:
        READS.add(node._get_full_key(key))
    except Exception:
        pass
    finally:
        _paused[0] -= 1


def _recording(method):
    def wrapped(self, key, *args, **kwargs):
        value = method(self, key, *args, **kwargs)
        _record(self, key)
        return value
    return wrapped


class RecordingDict(dict):
    """RunContext.config: a plain dict (as the run has it) that records subscripts and .get."""

    def __init__(self, tree: dict, prefix: str = "") -> None:
        super().__init__({k: RecordingDict(v, f"{prefix}{k}.") if isinstance(v, dict) else v for k, v in tree.items()})
        self.prefix = prefix

    def __getitem__(self, key):
        if not _paused[0]:
            READS.add(f"{self.prefix}{key}")
        return super().__getitem__(key)

    def get(self, key, default=None):
        if not _paused[0]:
            READS.add(f"{self.prefix}{key}")
        return super().get(key, default)


def _paused_during(function):
    def wrapped(*args, **kwargs):
        _paused[0] += 1
        try:
            return function(*args, **kwargs)
        finally:
            _paused[0] -= 1
    return wrapped


def _plain(tree: Any) -> Any:
    return {k: _plain(v) for k, v in dict.items(tree)} if isinstance(tree, dict) else tree


def install() -> None:
    from omegaconf import OmegaConf

    import dpo_sweeps.app as app
    import dpo_sweeps.runtime.rank as rank
    from dpo_sweeps.runtime.context import RunContext

    create = OmegaConf.create  # a DictConfig made from the run's dict (not a read): OmegaConf takes plain dicts

    def plain_create(*args: Any, **kwargs: Any) -> Any:
        return create(*(_plain(args[0]), *args[1:]) if args else (), **kwargs)

    OmegaConf.create = staticmethod(plain_create)

    for name in ("__getattr__", "__getitem__", "get"):
        setattr(DictConfig, name, _recording(getattr(DictConfig, name)))
    app.RunContext = lambda **fields: RunContext(**{**fields, "config": RecordingDict(fields["config"])})
    for module, names in ((app, ("validate_config", "check_settings_used")),
                          (rank, ("validate_config",))):
        for name in names:
            setattr(module, name, _paused_during(getattr(module, name)))


def run_once(overrides: list[str]) -> dict:
    from hydra.core.global_hydra import GlobalHydra

    import dpo_sweeps.__main__ as cli

    READS.clear()
    GlobalHydra.instance().clear()
    sys.argv = ["dpo_sweeps", *overrides]
    environ = dict(os.environ)  # a run sets MASTER_PORT and RANK for its process: the next is no torchrun rank
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return {"overrides": overrides, "returncode": code, "read": sorted(READS)}


def main(argv: list[str]) -> None:
    out, runs, current = argv[0], [], None
    for arg in argv[1:]:
        if arg == "--":
            current = []
            runs.append(current)
        else:
            current.append(arg)
    install()
    results = [run_once(overrides) for overrides in runs]
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
