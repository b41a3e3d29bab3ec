"""Will a config fit its device? The memory estimate from the config alone, before anything launches.

A sweep compares every point's estimated peak (memory_estimate.py) with `resources.device_memory_gib`
and does not start the points that would not fit (launchers/preflight.py). Before launch there is no
data and no model, so the estimate here takes:
- the architecture from the model config, built on the `meta` device (no weights, no memory), with the
  tokenizer's vocabulary: the byte tokenizer's, `model.tokenizer.vocab_size` for a BPE still to be
  trained, or the saved or named model's own config;
- `data.max_length` as every row's length (runs pad to their longest row, which is at most that);
- on a CPU, a rank's resident memory before its model exists, measured once in a fresh Python
  process that imports what a rank imports (`rank_baseline_bytes`; this process, with Hydra, the
  sweeper and meta-device models loaded, is larger). A rank also holds its data, which is not
  counted here (the sweep has not read it).
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dpo_sweeps.parallel.gpu_driver import gpu_driver_present, wants_cuda
from dpo_sweeps.parallel.memory_estimate import GIB, ModelShape, estimate_peak_memory, run_shape_of
from dpo_sweeps.parallel.plan import resolve_plan
from dpo_sweeps.parallel.process_memory import resident_bytes


@dataclass(frozen=True)
class FitCheck:
    estimate_gib: float
    limit_gib: float

    @property
    def fits(self) -> bool:
        return self.estimate_gib <= self.limit_gib

    def message(self) -> str:
        return (f"estimated peak {self.estimate_gib:.2f} GiB per device exceeds resources.device_memory_gib "
                f"{self.limit_gib:.2f} GiB; not started (hydra.sweeper.skip_predicted_oom=false runs it anyway)")


def may_have_limit(resources, cluster=None) -> bool:
    """Whether a config with these `resources` and `cluster` (its typed sections) may have a limit to check
    (device_memory_limit_gib)."""
    return (resources.device_memory_gib is not None or _cluster_memory_gib(cluster) is not None
            or (resources.device != "cpu" and gpu_driver_present()))


def _cluster_memory_gib(cluster) -> float | None:
    """The device memory of the cluster a config names (cluster=); None without one, or for cluster=cpu."""
    return None if cluster is None or cluster.measured else cluster.device_memory_gib


def device_memory_limit_gib(cfg) -> float | None:
    """`resources.device_memory_gib`, else the device memory of the cluster the config names (cluster=),
    else the memory of this machine's first CUDA device when the run will use CUDA; None (no check) on a
    CPU or where no GPU is visible to the sweep."""
    if not may_have_limit(cfg.resources, cfg.cluster):  # no GPU: no check, and no torch to load
        return None
    if cfg.resources.device_memory_gib is not None:
        return float(cfg.resources.device_memory_gib)
    if _cluster_memory_gib(cfg.cluster) is not None:
        return float(cfg.cluster.device_memory_gib)
    if wants_cuda(cfg.resources.device):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    return None


def model_shape(model_cfg) -> ModelShape:
    """The architecture of a config's `model` section (built on the meta device, once per architecture)."""
    return _model_shape(architecture_key(model_cfg))


def model_shape_of(cfg) -> ModelShape:
    """The shape of a resolved config's model as it trains: with peft, its adapters beside the base's
    weights, only they trained, and under qlora the base's 4-bit weights."""
    shape = model_shape(cfg.model)
    if cfg.peft.method != "none":
        shape = _with_adapters(shape, architecture_key(cfg.model), peft_key(cfg))
    return shape


def predicted_peak_gib(cfg, world_size: int) -> float:
    """The estimated peak memory per device of a resolved config, in GiB."""
    shape = model_shape_of(cfg)
    on_gpu = wants_cuda(cfg.resources.device) or _cluster_memory_gib(cfg.cluster) is not None  # a GPU cluster
    baseline = 0 if on_gpu else rank_baseline_bytes()
    plan = resolve_plan(cfg, world_size)
    return estimate_peak_memory(shape, run_shape_of(cfg, plan), baseline_bytes=baseline).total / GIB


def check_fit(cfg, world_size: int) -> FitCheck | None:
    """The fit check of one config (None when there is no limit to check against)."""
    limit = device_memory_limit_gib(cfg)
    if limit is None:
        return None
    return FitCheck(predicted_peak_gib(cfg, world_size), limit)


# Settings the estimate (and the limit) never read: training dynamics and bookkeeping. Points of a sweep
# that differ only in them share one fit check (launchers/preflight.py); tests/unit/test_fit_key.py
# changes each of them and finds the estimate unchanged.
NOT_ESTIMATED = {
    "train": ("seed", "lr", "lr_schedule", "weight_decay", "warmup_steps", "max_steps", "eval_every",
              "eval_max_pairs", "log_every", "max_grad_norm", "time_limit_min", "progress_bar", "save_model"),
    "loss": ("beta", "label_smoothing"),
    "wandb": None, "faults": None, "checkpoint": None,  # None: the whole section
}


def fit_key(task_config: dict, world_size: int) -> str:
    """What decides a resolved config's fit check, as a string: equal keys, equal checks."""
    import json

    kept = {}
    for section, value in task_config.items():
        dropped = NOT_ESTIMATED.get(section, ())
        if dropped is None:
            continue
        kept[section] = {k: v for k, v in value.items() if k not in dropped} if dropped else value
    return json.dumps([world_size, kept], sort_keys=True, default=str)


RANK_IMPORTS = "dpo_sweeps.train.lifecycle"  # the module a rank process runs (and all it imports)


class _Estimator:
    """A fresh Python process that imports what a rank imports, reports its resident memory (the rank
    baseline), then builds the model shapes it is sent (one JSON architecture key a line, one reply a
    line). It starts while a sweep composes its points (`measure_in_background`), so neither its
    imports nor torch's and transformers' model classes cost the sweep its time, or this process its memory."""

    CODE = (f"import {RANK_IMPORTS}; from dpo_sweeps.models.build import load_model_code; load_model_code(); "
            "from dpo_sweeps.parallel.process_memory import resident_bytes; print(resident_bytes(), "
            "flush=True); from dpo_sweeps.parallel.fit import serve_model_shapes; serve_model_shapes()")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Any = None
        self.failed = False
        self.baseline: int | None = None
        self.pending: list[tuple] = []  # keys sent, replies not read yet
        self.replies: dict[tuple, dict] = {}

    def start(self, key: tuple | None = None) -> None:
        with self.lock:
            self._start()
            if key is not None and key not in self.replies and key not in self.pending:
                self._send(key)

    def rank_baseline(self) -> int | None:
        with self.lock:
            self._start()
            return self._read_baseline()

    def model_shape(self, key: tuple) -> dict | None:
        """The reply for `key`: {"shape": [...]} or {"error": class name, "message": ...}; None: no worker."""
        with self.lock:
            self._start()
            if self._read_baseline() is None:
                return None
            if key not in self.replies:
                if key not in self.pending:
                    self._send(key)
                while key not in self.replies and not self.failed:
                    self._read_reply()
            return self.replies.get(key)

    def stop(self) -> None:
        """End the process; its replies are kept, and a later question starts another (whose first line is its
        own baseline again)."""
        with self.lock:
            proc, self.proc, self.pending, self.baseline, self.failed = self.proc, None, [], None, False
        if proc is None:
            return
        try:
            proc.stdin.close()  # its loop ends at end of input
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - whatever it is doing, it goes
            proc.kill()
            proc.wait()

    def _start(self) -> None:
        import subprocess
        import sys

        if self.proc is None and not self.failed:
            try:
                self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.failed = True

    def _send(self, key: tuple) -> None:
        import json

        try:
            self.proc.stdin.write(json.dumps(key) + "\n")
            self.proc.stdin.flush()
            self.pending.append(key)
        except (OSError, AttributeError, ValueError):
            self.failed = True

    def _read_baseline(self) -> int | None:
        if self.baseline is None and not self.failed:
            try:
                self.baseline = int(self.proc.stdout.readline().split()[-1])
            except (OSError, AttributeError, ValueError, IndexError):
                self.failed = True
        return self.baseline

    def _read_reply(self) -> None:
        import json

        try:
            self.replies[self.pending.pop(0)] = json.loads(self.proc.stdout.readline())
        except (OSError, ValueError, IndexError):
            self.failed = True


_estimator = _Estimator()
# The process would end by itself at end of input once this one exits, but its interpreter's teardown (torch,
# transformers) takes a moment: without waiting for it here it outlives the command. (A no-op if never started.)
atexit.register(_estimator.stop)


def measure_in_background(model_cfg=None) -> None:
    """Start the estimator process now (and the shape of `model_cfg`'s architecture), while the sweep
    composes its points: a fresh process's imports take seconds."""
    _estimator.start(architecture_key(model_cfg) if model_cfg is not None else None)


def stop_measuring() -> None:
    """End the estimator process once nothing more will be asked of it: a single run that checked its fit
    or forecast its cost would otherwise keep it, and a rank's imports in it, for the run's whole length."""
    _estimator.stop()


@lru_cache(maxsize=1)
def rank_baseline_bytes() -> int:
    """The resident memory of a fresh Python process once it has imported what a rank imports: a CPU
    rank's memory before its data and model. Falls back to this process's (larger: the safe side)
    where that process cannot be run."""
    return _estimator.rank_baseline() or resident_bytes()


def serve_model_shapes() -> None:
    """The estimator process's loop: an architecture key a line in, its ModelShape (or error) a line out."""
    import json
    import sys

    for line in sys.stdin:
        try:
            shape = _build_model_shape(tuple(json.loads(line)))
            reply = {"shape": [shape.num_params, shape.num_layers, shape.hidden, shape.intermediate, shape.vocab],
                     "trained_tensors": shape.trained_tensors}
        except Exception as exc:  # the sweep raises it (OSError, ValueError) or builds the shape itself
            reply = {"error": type(exc).__name__, "os_error": isinstance(exc, OSError),
                     "value_error": isinstance(exc, ValueError), "message": str(exc)}
        print(json.dumps(reply), flush=True)


def architecture_key(model_cfg) -> tuple:
    """What decides the architecture, hashable (sweep points often share their model); `model_cfg` the
    typed `model` section of a resolved config."""
    import json

    tokenizer = model_cfg.tokenizer
    return (model_cfg.init_from, model_cfg.name_or_path, json.dumps(model_cfg.from_config, sort_keys=True),
            tokenizer.kind, tokenizer.vocab_size, model_cfg.gguf_file)


@lru_cache(maxsize=64)
def _model_shape(key: tuple) -> ModelShape:
    reply = _estimator.model_shape(key)
    if reply is not None and "shape" in reply:
        return ModelShape(*reply["shape"], trained_tensors=reply["trained_tensors"])
    if reply is not None and (reply["os_error"] or reply["value_error"]):
        raise (OSError if reply["os_error"] else ValueError)(reply["message"])
    return _build_model_shape(key)  # no estimator process, or an error it could not pass on: build it here


def peft_key(cfg) -> str:
    import json
    from dataclasses import asdict

    return json.dumps({"peft": asdict(cfg.peft), "block_name": cfg.model.block_name}, sort_keys=True)


@lru_cache(maxsize=64)
def _with_adapters(shape: ModelShape, key: tuple, peft_key: str) -> ModelShape:
    """`shape` with the run's adapters (models/adapters.py), and under peft=qlora its 4-bit weights, counted
    on the architecture built on the meta device."""
    import json
    from dataclasses import replace

    from dpo_sweeps.config.schema import PeftConfig
    from dpo_sweeps.models.adapters import add_adapters

    spec = json.loads(peft_key)
    peft = PeftConfig(**spec["peft"])
    model = _meta_model(key)
    quantized = 0
    if peft.method == "qlora":  # the linear weights of the blocks in 4-bit (models/quantize.py), counted before
        from dpo_sweeps.models.quantize import quantizable_params  # peft wraps them

        quantized = quantizable_params(model, spec["block_name"])
    adapted = ModelShape.of(add_adapters(model, peft, spec["block_name"]))
    return replace(shape, num_params=adapted.num_params, trainable_params=adapted.trainable_params,
                   trained_tensors=adapted.trained_tensors,
                   quantized_params=quantized, double_quant=peft.double_quant)


def _build_model_shape(key: tuple) -> ModelShape:
    return ModelShape.of(_meta_model(key))


def _meta_model(key: tuple):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(architecture_config(key))


def architecture_config(key: tuple):
    """The transformers config of an architecture key (`architecture_key`), with the vocabulary the run's
    tokenizer gives it."""
    import json

    from transformers import AutoConfig

    from dpo_sweeps.rundir.paths import saved_model_path

    init_from, name_or_path, spec_json, tokenizer_kind, vocab_size, gguf_file = key
    if init_from is not None and (saved_model_path(init_from) / "config.json").exists():  # else an adapter's
        config = AutoConfig.from_pretrained(saved_model_path(init_from))
    elif spec_json != "null":
        spec = json.loads(spec_json)
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        if tokenizer_kind == "byte":
            from dpo_sweeps.models.tokenizers import byte_tokenizer

            config.vocab_size = len(byte_tokenizer())
        elif tokenizer_kind == "bpe" and vocab_size:
            config.vocab_size = int(vocab_size)  # an upper bound: a BPE trained on little text has fewer
    elif gguf_file is not None:
        from dpo_sweeps.models.gguf import plain_config, resolve_gguf_file

        config = plain_config(resolve_gguf_file(gguf_file))  # the file's metadata only
    else:
        config = AutoConfig.from_pretrained(name_or_path)
    return config
