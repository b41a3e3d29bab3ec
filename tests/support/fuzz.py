"""Bad input, generated: data files with random corruptions and random override sets, and the checks
every one must pass (tests/unit/test_fuzz_inputs.py runs a few; bench/fuzz_inputs.py many).

The property, for every input: the run completes, or it is refused with one line (a RunFailure, or
an error the CLI prints in one line), never another exception; and nothing already written changes.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
from pathlib import Path

from hypothesis import strategies as st
from omegaconf import OmegaConf

from dpo_sweeps.errors import RunFailure
from support import QUIET, REPO

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
# A value where text belongs: mostly text, sometimes what users' exports hold instead.
VALUE = st.one_of(TEXT, TEXT, TEXT, st.none(), st.integers(), st.floats(allow_nan=True), st.booleans(),
                  st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT}),
                           max_size=2),
                  st.lists(TEXT, max_size=2), st.dictionaries(TEXT, TEXT, max_size=2))
COLUMNS = ("prompt", "chosen", "rejected")
ROW = st.dictionaries(st.sampled_from(COLUMNS + ("extra", "Prompt")), VALUE, min_size=2, max_size=4)
# Most rows good, so most files have pairs left once the bad rows are dropped.
GOOD_ROW = st.builds(lambda i, p: {"prompt": f"q{i} {p}", "chosen": f" yes {i}", "rejected": f" no {i}"},
                     st.integers(0, 10**6), TEXT)
ROWS = st.lists(st.one_of(GOOD_ROW, GOOD_ROW, GOOD_ROW, ROW), min_size=0, max_size=12)
FORMATS = ("jsonl", "json", "csv", "tsv", "parquet")
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".jsonl.gz", ".csv.bz2", ".json.xz", ".txt", "")
ENCODINGS = ("utf-8", "utf-8-sig", "utf-16", "latin-1")
COMPRESS = {"none": lambda b: b, "gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}


def _cell(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def serialize(rows: list[dict], form: str) -> bytes | str:
    if form == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if form == "json":
        return json.dumps(rows, ensure_ascii=False)
    if form in ("csv", "tsv"):
        out = io.StringIO()
        writer = csv.writer(out, delimiter="," if form == "csv" else "\t")
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([_cell(r.get(c)) if r.get(c) is not None else "" for c in COLUMNS])
        return out.getvalue()
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: [None if r.get(c) is None else _cell(r.get(c)) for r in rows] for c in COLUMNS})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@st.composite
def data_files(draw) -> tuple[str, bytes]:
    """(file name, bytes): rows in a format, an encoding, a compression, a suffix that may not match,
    then corruptions (cut short, stray bytes, a flipped byte)."""
    form = draw(st.sampled_from(FORMATS))
    content = serialize(draw(ROWS), form)
    if isinstance(content, str):
        if draw(st.booleans()):
            content = content.replace("\n", "\r\n")
        content = content.encode(draw(st.sampled_from(ENCODINGS)), errors="replace")
    content = COMPRESS[draw(st.sampled_from(list(COMPRESS)))](content)
    for corruption in draw(st.lists(st.sampled_from(["cut", "stray", "flip", "prefix"]), max_size=2)):
        at = draw(st.integers(0, max(0, len(content))))
        if corruption == "cut":
            content = content[:at]
        elif corruption == "stray":
            content = content[:at] + draw(st.binary(min_size=1, max_size=4)) + content[at:]
        elif corruption == "flip" and content:
            at = min(at, len(content) - 1)
            content = content[:at] + bytes([content[at] ^ 0xFF]) + content[at + 1:]
        elif corruption == "prefix":
            content = draw(st.sampled_from([b"\xef\xbb\xbf", b"PAR1", b"\x1f\x8b", b"\n\n", b"{"])) + content
    suffix = draw(st.sampled_from((f".{form}",) * 3 + SUFFIXES))
    return f"prefs{suffix}", content


def one_line(message: str) -> None:
    assert message.strip() and "\n" not in message.strip(), f"not one line: {message!r}"


def check_data_file(folder: Path, name: str, content: bytes) -> str:
    """Read the file as data=preference does; the outcome ('read' or the failure kind), or AssertionError."""
    from dpo_sweeps.data.encoding import encode_pairs, render_pair
    from dpo_sweeps.data.sources import load_preference_rows
    from dpo_sweeps.models.tokenizers import byte_tokenizer

    path = folder / name
    path.write_bytes(content)
    cfg = OmegaConf.load(REPO / "conf" / "data" / "preference.yaml")
    cfg.path, cfg.eval_size = str(path), 1
    try:
        rows = load_preference_rows(cfg, folder)
    except RunFailure as exc:
        one_line(str(exc))
        assert str(exc).startswith("data."), str(exc)
        return exc.kind
    finally:
        assert path.read_bytes() == content  # reading changed nothing
    assert rows.train and rows.eval
    texts = [render_pair(r) for r in rows.train + rows.eval]  # every kept row renders and tokenizes
    encode_pairs(texts, byte_tokenizer(), max_length=64, max_prompt_length=32, truncation_mode="keep_end")
    return "read"


# Keys users set, and values of every type and range; unknown keys and group typos beside them.
KEYS = ("train.lr", "train.batch_size", "train.micro_batch_size", "train.max_steps", "train.warmup_steps",
        "train.lr_schedule", "train.eval_every", "train.max_grad_norm", "train.time_limit_min",
        "train.logps_chunk_size",
        "loss.beta", "loss.label_smoothing", "loss.sft_weight", "loss.nll_average", "data.max_length",
        "data.max_prompt_length", "data.noise", "data.eval_size", "data.max_pairs", "data.path",
        "data.truncation_mode", "fsdp.hybrid_group_size", "resources.nproc_per_node", "resources.nodes",
        "resources.device", "resources.cpu_allocator", "precision.initial_loss_scale", "model.tokenizer.vocab_size", "checkpoint.keep_last",
        "wandb.project", "probe.steps", "perf.warmup_steps", "train.lr_rate", "data.nosie", "loss.betta",
        # Keys read only beside other choices (dpo_sweeps/checks/unused.py).
        "train.sample_max_new_tokens", "model.install_hint", "fsdp.reshard_after_forward", "precision.name",
        "train.precompute_reference_logps", "resources.bind_cores", "checkpoint.every_steps", "loss.f_divergence")
GROUPS = {"data": ("synthetic", "hh", "preference", "hhh", "prefs"), "loss": ("dpo", "ipo", "simpo", "mix", "dpoo"),
          "fsdp": ("full_shard", "hybrid_shard", "no_shard", "fullshard"), "precision": ("fp32", "bf16", "fp8"),
          "model": ("tiny_gpt2", "tiny_llama", "gpt3")}
VALUES = st.one_of(st.integers(-3, 5000).map(str), st.floats(-1, 2, allow_nan=False).map(lambda f: f"{f:.3g}"),
                   st.sampled_from(["0", "0.0", "-1", "null", "true", "false", "abc", "1e-3", "???", "[1,2]",
                                    "{a: 1}", "''", "nan", "inf", "./nope.jsonl", "keep_end", "cpu", "cuda", "batch",
                                    "1", "2", "3", "tcmalloc", "jemalloc"]))
OVERRIDE = st.one_of(
    st.builds(lambda k, v, plus: f"{'+' if plus else ''}{k}={v}", st.sampled_from(KEYS), VALUES,
              st.sampled_from([False, False, False, True])),
    st.sampled_from([f"{g}={c}" for g, choices in GROUPS.items() for c in choices]),
    st.builds(lambda g: f"{g}={GROUPS[g][0]}", st.sampled_from(list(GROUPS))),
    # A group given what Hydra parses as no name (null, a number, a bool); a key or group deleted (~).
    st.builds(lambda g, v: f"{g}={v}", st.sampled_from(list(GROUPS)), st.sampled_from(["null", "1", "0.5", "true"])),
    st.builds(lambda k: f"~{k}", st.sampled_from(KEYS + tuple(GROUPS))),
)
OVERRIDE_SETS = st.lists(OVERRIDE, min_size=1, max_size=4)
# What every override set is checked and run with first (a set may change any of it): quiet, one step, a
# few held-out pairs. Only keys every config reads, so that none is refused as unread.
BASE = [*QUIET, "train.max_steps=1", "train.eval_every=0", "train.eval_max_pairs=8"]
# An accepted set bigger than this is checked in-process only: it would not be a short run here.
MAX_RANKS, MAX_STEPS = 2, 3


def check_overrides(overrides: list[str]) -> str:
    """Compose and check BASE + `overrides` as a single run does before it starts: 'accepted', 'accepted
    (too big to run here)', or the refusal's kind."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import CompactHydraException

    from dpo_sweeps.checks.schema_errors import group_refusal, one_line_message, schema_refusal
    from dpo_sweeps.checks.unused import check_settings_used
    from dpo_sweeps.checks.validate import validate_config
    from dpo_sweeps.config.schema import Config

    given = [*BASE, *overrides]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=given)
            config = Config.of(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
        except Exception as exc:  # what the CLI prints in one line, or a traceback
            refusal = schema_refusal(exc) or group_refusal(exc, given)
            assert refusal is not None or isinstance(exc, CompactHydraException), f"{overrides}: {exc!r}"
            one_line(str(refusal) if refusal is not None else one_line_message(exc))
            return "refused: " + ("schema" if refusal is not None else type(exc).__name__)
    try:
        check_settings_used(config, given)
        validate_config(config, REPO)
    except RunFailure as exc:
        one_line(str(exc))
        return f"refused: {exc.kind}"
    steps = config.probe.steps or config.train.max_steps
    if config.world_size > MAX_RANKS or steps > MAX_STEPS:
        return "accepted (too big to run here)"
    return "accepted"


def run_overrides(overrides: list[str], folder: Path, timeout: float = 300) -> str:
    """BASE + `overrides` through the real CLI, into a run directory that holds a file of the user's: the
    run completes (exit 0, no error line), or it exits nonzero with exactly one `error:` line; never a
    traceback, and the user's file is unchanged. Returns 'completed' or what refused it."""
    import subprocess
    import sys

    from support import cli_env

    run_dir = folder / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("the user's own file\n")
    args = [sys.executable, "-m", "dpo_sweeps", *BASE, *overrides, f"hydra.run.dir={run_dir}"]
    result = subprocess.run(args, cwd=folder, env=cli_env(), capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "Logging error" not in output, f"{overrides}: {output[-3000:]}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert (run_dir / "notes.txt").read_text() == "the user's own file\n", overrides
    if result.returncode == 0:
        assert not errors and json.loads((run_dir / "summary.json").read_text())["status"] == "completed", overrides
        return "completed"
    assert len(errors) == 1, f"{overrides}: {result.returncode}: {output[-3000:]}"
    failed = errors[0].removeprefix("error: ")
    return "refused by the run: " + (failed.split(":", 1)[0] if failed.startswith("run failed") else "before it started")
