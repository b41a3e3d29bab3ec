"""Run `python -m dpo_sweeps` recording which config keys the run reads (tests only).

    python tests/support/read_recorder.py OUT.json -- OVERRIDES... [-- OVERRIDES...]

runs each override list as one run of the real CLI, in this one process (imports paid once), and writes
OUT.json: for each run, its exit code and the sorted config keys it read. A run reads its settings as
attributes of the frozen, typed Config (`Config.of`, dpo_sweeps/config/schema.py): a key is read when
code asks a section of a run's Config for one of its fields (`cfg.train.lr`, `cfg.loss.beta`, a property
such as `cfg.world_size` reading resources.nodes and nproc_per_node). Bulk copies (`dataclasses.replace`
and `asdict`, the dataclass's own `__eq__`/`__repr__`; hashing and summary.json take the plain config)
are not reads. The checks before training (validate_config, the unread-setting check) read every key
they check, so recording stops while they run (the fit check of `resources.device_memory_gib` is
recorded: it is what that key is for); what is left is what the run uses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

READS: set[str] = set()
_paused = [0]
# Frames whose attribute reads copy a section whole (dataclasses.replace and asdict; the generated
# __eq__ and __repr__ of a dataclass are compiled from a string).
_BULK_FILES = {dataclasses.__file__, "<string>"}


def _paused_during(function):
    def wrapped(*args, **kwargs):
        _paused[0] += 1
        try:
            return function(*args, **kwargs)
        finally:
            _paused[0] -= 1
    return wrapped


def install() -> None:
    """Record field reads on every Config section reached from a run's Config.

    A section learns its dotted place when it is read from its parent (`Config` is the root, ""), so the
    sections a probe derives with dataclasses.replace are placed the same way. A section built on its own,
    not reached from a Config, is not recorded."""
    import dpo_sweeps.app as app
    import dpo_sweeps.train.lifecycle as lifecycle
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.config.section import Section

    field_names: dict[type, frozenset[str]] = {}
    base_getattribute = object.__getattribute__

    def getattribute(self: Section, name: str) -> Any:
        value = base_getattribute(self, name)
        if name[0] == "_":
            return value
        prefix = base_getattribute(self, "_read_prefix")
        if prefix is None:
            return value
        cls = type(self)
        if cls not in field_names:
            field_names[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        if name not in field_names[cls]:
            return value
        if isinstance(value, Section):
            object.__setattr__(value, "_read_prefix", f"{prefix}{name}.")
        elif not _paused[0] and sys._getframe(1).f_code.co_filename not in _BULK_FILES:
            READS.add(f"{prefix}{name}")
        return value

    Section._read_prefix = None
    Config._read_prefix = ""
    Section.__getattribute__ = getattribute
    for module, names in ((app, ("validate_config", "check_settings_used")),
                          (lifecycle, ("validate_config",))):
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
