"""Tokenizers that need no download: byte-level, or a byte-level BPE trained on the run's text.

Both are `PreTrainedTokenizerFast` objects, so the rest of the code treats them exactly like a hub
tokenizer. A trained BPE is cached under `$DPO_SWEEPS_CACHE` (default `~/.cache/dpo_sweeps`) keyed by
its vocabulary size and a digest of the text it was trained on, so every rank and every run of a
sweep uses the same one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dpo_sweeps.rundir.paths import cache_root

EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [EOS, PAD]

log = logging.getLogger(__name__)


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD, unk_token=None
    )


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Every UTF-8 byte is a token (256 of them), plus end-of-text and padding."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in SPECIAL_TOKENS:
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return _wrap(tok)


def bpe_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` tokens trained on `texts`, cached on disk."""
    digest = hashlib.sha256()
    digest.update(str(vocab_size).encode())
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    path = cache_root() / "tokenizers" / f"bpe-{vocab_size}-{digest.hexdigest()[:16]}"
    if (path / "tokenizer.json").exists():
        try:
            return _wrap(Tokenizer.from_file(str(path / "tokenizer.json")))
        except Exception as exc:  # a cache entry that does not load is retrained, never a failure
            log.warning("cached tokenizer %s does not load (%s); training it again", path, exc)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_batches(texts), trainer=trainer, length=len(texts))
    # Write to a private folder, then rename: ranks and concurrent runs may race to fill the cache.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    except OSError as exc:  # a cache that cannot be written is skipped, never a failure
        log.warning("cannot cache the tokenizer under %s (%s); not cached (DPO_SWEEPS_CACHE moves the cache)",
                    path.parent, exc)
        return _wrap(tok)
    try:
        tok.save(str(tmp / "tokenizer.json"))
        os.rename(tmp, path)
    except Exception as exc:  # another process won the race (its file is the same tokenizer), or a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / "tokenizer.json").exists():
            log.warning("cannot cache the tokenizer at %s (%s); not cached", path, exc)
            return _wrap(tok)
    return _wrap(Tokenizer.from_file(str(path / "tokenizer.json")))


def _batches(texts: list[str], size: int = 256) -> Iterable[list[str]]:
    for start in range(0, len(texts), size):
        yield texts[start : start + size]
