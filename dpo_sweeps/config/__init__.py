"""The run's configuration: the typed schema every run and sweep point is read into (checks/ validates it)."""

from pathlib import Path


def config_dir() -> str:
    """conf/ beside the package in a source checkout or editable install, else the installed copy."""
    source_tree = Path(__file__).resolve().parent.parent.parent / "conf"
    if (source_tree / "config.yaml").exists():
        return str(source_tree)
    import dpo_sweeps.conf as installed

    return str(Path(installed.__file__).parent)
