"""GGUF files as a model source (`model.gguf_file`): weights, tokenizer and chat template in one file.

transformers reads a GGUF file of any architecture it supports and dequantizes it into a plain
model, which takes a minute or more and cannot be saved as it is (a model loaded from GGUF refuses
`save_pretrained`). So the first run dequantizes once and writes a Hugging Face folder (config,
fp32 safetensors, tokenizer with its chat template) under `$DPO_SWEEPS_CACHE/gguf/<content hash>/`
(default `~/.cache/dpo_sweeps`); every later load, on every rank, is a plain `from_pretrained` of
that folder. One process fills an entry while the others wait on its lock file, so the ranks of a
run (or the jobs of a sweep) never dequantize the same file side by side. Where the cache cannot be
written, the run warns and loads from the GGUF file itself.

`model.gguf_file` is a path, or `pkg://PACKAGE/FILE` for a file shipped inside an installed Python
package (found from the package's import spec, without importing it).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.paths import cache_root, writing

log = logging.getLogger(__name__)

PACKAGE_SCHEME = "pkg://"
GGUF_SOURCES = "a local .gguf file, or pkg://PACKAGE/FILE for a file inside an installed Python package"
GGUF_MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file (the format's own magic number)
# Marks a complete cache entry; written last, so a folder without it is a fill that did not finish.
COMPLETE = "source.json"
HASH_CHUNK = 1 << 22


def gguf_cache_root() -> Path:
    return cache_root() / "gguf"


def resolve_gguf_file(spec: str, install_hint: str | None = None) -> Path:
    """The GGUF file `model.gguf_file` names; a one-line InvalidConfig when it does not exist or is not GGUF."""
    hint = f"; to get it: {install_hint}" if install_hint else ""
    if spec.startswith(PACKAGE_SCHEME):
        package, _, name = spec[len(PACKAGE_SCHEME):].partition("/")
        try:
            found = importlib.util.find_spec(package) if package else None
        except (ImportError, ValueError):
            found = None
        if found is None or not found.submodule_search_locations:
            raise InvalidConfig("model.gguf_file", f"'{spec}': the package '{package}' is not installed{hint}",
                                GGUF_SOURCES)
        path = Path(next(iter(found.submodule_search_locations))) / name
    else:
        path = Path(spec).expanduser()
    if not path.is_file():
        raise InvalidConfig("model.gguf_file", f"no such file '{spec}' (resolved to {path}){hint}", GGUF_SOURCES)
    # Read here, before any job starts: a rank would only find it out when transformers parses the file.
    try:
        with open(path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise InvalidConfig("model.gguf_file", f"cannot read '{spec}': {exc.strerror}", GGUF_SOURCES) from exc
    if magic != GGUF_MAGIC:
        raise InvalidConfig("model.gguf_file", f"'{spec}' is not a GGUF file (it does not open with the bytes "
                            "'GGUF')", GGUF_SOURCES)
    return path.resolve()


def content_hash(path: Path) -> str:
    """sha256 of the file's bytes, streamed; remembered per (path, size, mtime) in the cache, so that a
    file is read through once, not at every run or by every rank."""
    stat = path.stat()
    identity = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    return _content_hash(str(path), identity)


@lru_cache(maxsize=16)
def _content_hash(path: str, identity: str) -> str:
    memo = gguf_cache_root() / "hashes" / identity
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(memo, value)
    except OSError:  # an unwritable cache only costs the next run a re-read
        pass
    return value


def cache_entry(path: Path) -> Path:
    """Where `path`'s dequantized model is cached (complete once it holds COMPLETE)."""
    return gguf_cache_root() / content_hash(path)[:20]


def cached_folder(path: Path) -> Path | None:
    """The Hugging Face folder of `path`'s dequantized model, filled now if missing; None (with a
    warning) when the cache cannot be written: the caller then loads the GGUF file itself."""
    root = gguf_cache_root()
    try:
        entry = cache_entry(path)
        if (entry / COMPLETE).exists():
            return entry
        root.mkdir(parents=True, exist_ok=True)
        with _locked(entry.with_suffix(".lock")):
            if not (entry / COMPLETE).exists():  # another process may have filled it while we waited
                with writing(entry):  # safetensors and tokenizers fail in their own types: an OSError here
                    _fill(path, entry)
        return entry
    except OSError as exc:
        log.warning("model.gguf_file: cannot cache the dequantized model under %s (%s); loading %s directly "
                    "(set DPO_SWEEPS_CACHE to a writable folder to start later runs in seconds)", root, exc, path)
        return None


@contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fill(path: Path, entry: Path) -> None:
    """Dequantize `path` into a private folder, then rename it into place."""
    log.info("model.gguf_file: dequantizing %s once into %s", path, entry)
    tokenizer, plain = load_tokenizer(path), load_model(path)
    shutil.rmtree(entry, ignore_errors=True)  # a fill that died half-way
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}-"))
    tmp.chmod(0o755)  # mkdtemp's is private; the cache may serve other users' runs
    try:
        _save_weights(plain, tmp)
        plain.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE).write_text(json.dumps({"gguf_file": str(path), "sha256": content_hash(path)}) + "\n")
        os.rename(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _save_weights(model, folder: Path) -> None:
    """model.safetensors as save_pretrained writes it, one name per tensor (tied embeddings are stored
    once). Not save_pretrained itself: under torch.distributed it writes only on rank 0, and the process
    that fills the cache may be any rank."""
    from safetensors.torch import save_file

    state, seen = {}, set()
    for name, tensor in model.state_dict().items():  # the input embedding comes before the tied LM head
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            state[name] = tensor.contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def plain_config(path: Path):
    """The transformers config of the GGUF's model, without the GGUF quantization record (reads only metadata)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def load_tokenizer(path: Path):
    """The tokenizer (and chat template) stored in the GGUF file; reads no weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def load_model(path: Path):
    """The GGUF model dequantized to fp32, as a plain model (slow: cached_folder keeps the result)."""
    import torch
    from transformers import AutoModelForCausalLM

    quantized = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # A model loaded from GGUF is not serializable (nor meant to train): its weights go into a plain
    # model of the same config.
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(plain_config(path), dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    return plain


def tokenizer_of(path: Path):
    """The file's tokenizer from its cache entry when there is one, else from the file (no weights read)."""
    from transformers import AutoTokenizer

    entry = cache_entry(path)
    return AutoTokenizer.from_pretrained(entry) if (entry / COMPLETE).exists() else load_tokenizer(path)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
