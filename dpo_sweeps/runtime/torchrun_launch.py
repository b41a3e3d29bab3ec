"""`dpo-sweeps-torchrun`: torchrun, whose own stop and failure reports are one line, not a traceback.

    dpo-sweeps-torchrun --nproc_per_node=2 -m dpo_sweeps fsdp=shard_grad_op train.max_steps=200
    python -m dpo_sweeps.runtime.torchrun_launch --nproc_per_node=2 -m dpo_sweeps ...   # the same

takes exactly torchrun's arguments and runs torchrun's own code (`torch.distributed.run.parse_args`
and `run`). The ranks behave as under torchrun: a Ctrl-C or SIGHUP reaches them (from the terminal and
from torchrun, which passes its stop signal on), they checkpoint and record `interrupted`, and rank 0
prints the run's one `error:` line. torchrun itself then raises SignalException (on a stop) or
ChildFailedError (when a rank exits nonzero), which plain torchrun prints as a traceback; here each is
one line naming the signal or the first failed rank, and the exit code is 128 + the signal, or 1.
"""

from __future__ import annotations

import signal
import sys

from dpo_sweeps.errors import say
from dpo_sweeps.runtime.startup import INTERRUPTED_BEFORE_START, python_handles_ctrl_c


def main(argv: list[str] | None = None) -> None:
    python_handles_ctrl_c()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name
        say(f"torchrun: stopped by {name}; its ranks stopped as their run's summary.json says")
        sys.exit(128 + int(exc.sigval))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        how = (f"signal {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
               else f"exit code {failure.exitcode}")
        say(f"torchrun: rank {rank} ended first, with {how} ({len(exc.failures)} of the ranks failed); "
            "the run's error line and summary.json say why")
        sys.exit(1)
    except KeyboardInterrupt:  # before torchrun took the signals over: no rank started
        say(INTERRUPTED_BEFORE_START)
        sys.exit(130)


if __name__ == "__main__":
    main()
