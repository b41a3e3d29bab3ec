"""`python -m dpo_sweeps [overrides]`: one run; `-m` for a sweep (Hydra multirun)."""

from __future__ import annotations

from pathlib import Path

import hydra

from dpo_sweeps.task import run


def config_dir() -> str:
    """conf/ beside the package in a source checkout or editable install, else the installed copy."""
    source_tree = Path(__file__).resolve().parent.parent / "conf"
    if (source_tree / "config.yaml").exists():
        return str(source_tree)
    import dpo_sweeps.conf as installed

    return str(Path(installed.__file__).parent)


# Wrapped here, not decorated at the definition: submitit must pickle `run` by reference.
main = hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")(run)

if __name__ == "__main__":
    main()
