"""A process's start: the seconds it spends importing before it trains.

Ctrl-C while the command starts: `python -m dpo_sweeps` (or `dpo-sweeps`) spends its first seconds
importing (Hydra, then torch and transformers); a SIGINT there would print a KeyboardInterrupt traceback
from whichever import it hit. The package installs `quiet_ctrl_c_while_starting` first thing when it is
the command being run, and `dpo_sweeps.__main__.main` gives Python's handler back once it can catch
KeyboardInterrupt itself. A SIGINT ignored when the command starts (nohup, `trap '' INT`) stays ignored.

The training stack's import (`importing_the_training_stack`, which dpo_sweeps/train/entry.py enters): every
process that trains (a run, a rank, a job's task) imports torch, transformers and torch.distributed; it is
most of what a short run costs.
oneDNN's primitive cache (`bound_onednn_primitive_cache`): set before the first matrix product of the
process, which is when oneDNN reads it.
Imports only the standard library at module level: it runs before anything else of the package.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

INTERRUPTED_BEFORE_START = "error: interrupted (Ctrl-C) before the run started; nothing was trained"

# oneDNN (a CPU's bf16 and fp16 matrix products) keeps a compiled primitive, with its buffers, for every
# input shape it meets, up to 1,024 by default. Micro-batches of rows of varying length make new shapes
# step after step, so a CPU rank's memory grew for tens of steps past what a probe measures; 32 bounded
# it and kept SmolLM2's step time (bench/README.md, "oneDNN's primitive cache bounded").
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 32


def _stop(signum: int, frame: object) -> None:
    try:
        print(INTERRUPTED_BEFORE_START, file=sys.stderr, flush=True)
    except OSError:
        pass
    os._exit(130)  # nothing was written yet; unwinding an import half-way gains nothing


def is_the_command() -> bool:
    """Whether this process is `python -m dpo_sweeps[.x]` or the `dpo-sweeps` script (not an import)."""
    first = sys.argv[0] if sys.argv else ""
    return first == "-m" or os.path.basename(first) == "dpo-sweeps"


def quiet_ctrl_c_while_starting() -> None:
    if is_the_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop)


def python_handles_ctrl_c() -> None:
    """From here on a Ctrl-C is a KeyboardInterrupt again (main() catches it; the run installs its own)."""
    if signal.getsignal(signal.SIGINT) is _stop:
        signal.signal(signal.SIGINT, _keyboard_interrupt)


_ctrl_c_seen = False


def _keyboard_interrupt(signum: int, frame: object) -> None:
    # Python's own handler, remembered: a KeyboardInterrupt raised while the garbage collector runs a
    # weakref callback or a __del__ (often, during an import) is printed as "Exception ignored" and lost,
    # and the run would go on as if no Ctrl-C had come. surface_ctrl_c() raises it again.
    global _ctrl_c_seen
    _ctrl_c_seen = True
    raise KeyboardInterrupt


def surface_ctrl_c() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C that came before the run took the signals over, if Python lost
    it in a callback: called once the training stack is imported, before the run takes its directory."""
    if _ctrl_c_seen:
        raise KeyboardInterrupt


def bound_onednn_primitive_cache() -> None:
    """oneDNN's primitive cache at ONEDNN_CACHE_CAPACITY in this process and the ones it starts, unless
    the environment already sets it (the user's value stays)."""
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))


@contextmanager
def importing_the_training_stack() -> Iterator[None]:
    """Import with Python's cyclic garbage collector off, then freeze what is there.

    The import makes about half a million objects that live as long as the process and none of them is
    garbage; yet the collector runs every few hundred allocations and walks them all again as they grow,
    and once more at exit. Frozen (gc.freeze), no collection looks at them again, the last one at the
    process's end included; training's own garbage is collected as before. bench/startup.py measures it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
