"""bench/rss_timeline.py's probe, loaded into every Python process of a run through PYTHONPATH.

With RSS_TIMELINE_DIR set, each rank records, at the end of every phase of its trainer, its resident set
and its malloc's heap (glibc's or tcmalloc's), to RSS_TIMELINE_DIR/<rank>-<pid>.jsonl. Measurement only: it wraps the trainer's
setup functions and heartbeat, and changes nothing the run computes. Without RSS_TIMELINE_DIR it does nothing.
"""

import os

if os.environ.get("RSS_TIMELINE_DIR"):
    import ctypes
    import functools
    import importlib.abc
    import importlib.util
    import json
    import sys
    import threading
    import time

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        _libc = ctypes.CDLL("libc.so.6")
        _libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        _libc = None

    # tcmalloc (resources.cpu_allocator=tcmalloc) answers through gperftools' MallocExtension C API instead.
    _tcmalloc = ctypes.CDLL(None)
    if hasattr(_tcmalloc, "MallocExtension_GetNumericProperty"):
        _tcmalloc.MallocExtension_GetNumericProperty.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
    else:
        _tcmalloc = None

    def _tcmalloc_property(name: str) -> int:
        value = ctypes.c_size_t(0)
        _tcmalloc.MallocExtension_GetNumericProperty(name.encode(), ctypes.byref(value))
        return value.value

    MIB = 2**20
    _lock = threading.Lock()
    _state = {"phase": "start", "peak": 0.0, "t0": time.time(), "file": None}

    def _status() -> dict:
        """VmRSS, VmHWM, RssAnon, RssFile of this process, in MiB."""
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) / 1024
        return out

    def _heap() -> dict:
        """glibc's malloc statistics over all arenas (mallinfo2), or tcmalloc's, in MiB."""
        if _tcmalloc is not None:  # mapped heap, what is allocated, and what its page heap and caches hold free
            heap = _tcmalloc_property("generic.heap_size") - _tcmalloc_property("tcmalloc.pageheap_unmapped_bytes")
            return {"heap": heap / MIB, "in_use": _tcmalloc_property("generic.current_allocated_bytes") / MIB,
                    "free": (heap - _tcmalloc_property("generic.current_allocated_bytes")) / MIB, "mmapped": 0.0}
        if _libc is None:
            return {}
        m = _libc.mallinfo2()
        return {"heap": m.arena / MIB, "in_use": m.uordblks / MIB, "free": m.fordblks / MIB, "mmapped": m.hblkhd / MIB}

    def record(kind: str, **extra) -> None:
        with _lock:
            if _state["file"] is None:
                rank = os.environ.get("RANK", "x")
                _state["file"] = open(os.path.join(os.environ["RSS_TIMELINE_DIR"], f"{rank}-{os.getpid()}.jsonl"), "a")
            row = {"t": round(time.time() - _state["t0"], 3), "kind": kind, "phase": _state["phase"],
                   "phase_peak": round(_state["peak"], 1), **_status(), **_heap(), **extra}
            _state["file"].write(json.dumps(row) + "\n")
            _state["file"].flush()

    def enter(phase: str) -> None:
        record("end")
        with _lock:
            _state["phase"], _state["peak"] = phase, 0.0

    def _sample() -> None:
        while True:  # the phase's peak resident set, between its two records
            try:
                rss = _status()["VmRSS"]
            except (OSError, KeyError):
                rss = 0.0
            with _lock:
                _state["peak"] = max(_state["peak"], rss)
            time.sleep(0.005)

    threading.Thread(target=_sample, daemon=True).start()

    def _phase(module, name: str) -> None:
        fn = getattr(module, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                enter(f"after {name}")

        setattr(module, name, wrapper)

    def _block_hooks(model, block_name: str) -> None:
        """A record at each block's forward and at the start of its backward (RSS_TIMELINE_BLOCKS)."""
        for i, block in enumerate(m for m in model.modules() if type(m).__name__ == block_name):
            def forward_pre(module, args, i=i):
                record("block_forward", block=i)

            def forward(module, args, output, i=i):
                out = output[0] if isinstance(output, tuple) else output
                if getattr(out, "requires_grad", False):
                    out.register_hook(lambda grad, i=i: record("block_backward", block=i))

            block.register_forward_pre_hook(forward_pre)
            block.register_forward_hook(forward)

    def _instrument(trainer_module) -> None:
        from dpo_sweeps.train import final_metrics, reference_pass, setup

        for name in ("build_data", "build_models", "precompute_reference_logps", "free_reference", "build_optimizer",
                     "build_policy", "build_reference", "build_mesh", "shard_model"):
            _phase(setup, name)
        shard_model = setup.shard_model

        def shard_model_with_hooks(model, **kwargs):
            if kwargs.get("trainable", True) and os.environ.get("RSS_TIMELINE_BLOCKS"):
                _block_hooks(model, kwargs["block_name"])  # before fully_shard renames the block classes
            return shard_model(model, **kwargs)

        setup.shard_model = shard_model_with_hooks
        trainer = trainer_module.Trainer
        init, final = trainer.__init__, trainer.final_metrics

        def __init__(self, *args, **kwargs):
            enter("trainer")
            init(self, *args, **kwargs)
            heartbeat = self.heartbeat

            def phase_heartbeat(step, phase):
                enter(f"step {step} {phase}")
                heartbeat(step, phase)

            self.heartbeat = phase_heartbeat

        def final_metrics_with_estimate(self):
            enter("final_metrics")
            estimate = final_metrics.memory_estimate(self.cfg, self.plan, self.built)
            record("estimate", rss_before_model=self.built.rss_before_model / MIB, longest_row=self.built.longest_row,
                   **{k: v / MIB for k, v in vars(estimate).items()})
            return final(self)

        trainer.__init__, trainer.final_metrics = __init__, final_metrics_with_estimate
        score = reference_pass.reference_batch_logps

        def reference_batch(reference, pairs, *args, **kwargs):  # one record per micro-batch the reference pass scores
            out = score(reference, pairs, *args, **kwargs)
            record("reference_batch", pairs=len(pairs), longest=max(p.length for p in pairs))
            return out

        reference_pass.reference_batch_logps = reference_batch
        for name in ("setup", "evaluate"):
            _phase(trainer, name)

    class _Finder(importlib.abc.MetaPathFinder):
        """Instruments dpo_sweeps.train.trainer right after it is imported."""

        def find_spec(self, fullname, path, target=None):
            if fullname != "dpo_sweeps.train.trainer":
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            exec_module = spec.loader.exec_module

            def exec_and_instrument(module):
                exec_module(module)
                _instrument(module)

            spec.loader.exec_module = exec_and_instrument
            return spec

    sys.meta_path.insert(0, _Finder())
