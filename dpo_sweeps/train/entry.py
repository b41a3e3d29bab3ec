"""Where a process starts to train: `run_rank` imported with the training stack, and a local rank
process's entry. Imports nothing heavy at module level: the process that starts local ranks imports
this module and supervises them without torch.
"""

from __future__ import annotations

from collections.abc import Callable

from dpo_sweeps.redaction import redact_output
from dpo_sweeps.runtime.startup import bound_onednn_primitive_cache, importing_the_training_stack


def training_rank() -> Callable:
    """`dpo_sweeps.train.lifecycle.run_rank`, imported with the training stack (torch, transformers,
    torch.distributed) inside importing_the_training_stack: by the processes that train, and only by
    them (the process that starts local ranks supervises them without it). oneDNN's primitive cache is
    bounded first, also in a process the command did not start (srun --export=NONE)."""
    bound_onednn_primitive_cache()
    with importing_the_training_stack():
        from dpo_sweeps.train.lifecycle import run_rank
    return run_rank


def start_rank(payload: bytes) -> None:
    """A local rank process's entry (dpo_sweeps/runtime/local_ranks.py). Its arguments come pickled;
    the rank imports the training stack first (`training_rank`), and then unpickles them."""
    import pickle

    redact_output()
    run_rank = training_rank()
    from dpo_sweeps.runtime.local_ranks import rank_process

    ctx, env = pickle.loads(payload)
    rank_process(ctx, env, run_rank)
