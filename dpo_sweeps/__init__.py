"""dpo-sweeps: find the best FSDP setup for DPO training, one Hydra sweep at a time."""

# First, before the imports that take seconds: `python -m dpo_sweeps` stopped by Ctrl-C while it starts
# says so in one line, and its processes' oneDNN cache is bounded before any of them computes
# (dpo_sweeps/runtime/startup.py).
from dpo_sweeps.runtime.startup import bound_onednn_primitive_cache, is_the_command, quiet_ctrl_c_while_starting

quiet_ctrl_c_while_starting()
if is_the_command():
    bound_onednn_primitive_cache()

from dpo_sweeps.config.schema import register as register_schema  # noqa: E402 (after the handler)
from dpo_sweeps.dpo.losses.schema import register as register_loss_schemas  # noqa: E402
from dpo_sweeps.runtime.launch_time import register_resolver  # noqa: E402

__version__ = "0.1.0"

# `${launch_time:...}` (conf/config.yaml's hydra.run.dir) resolves in every process that loads the package.
register_resolver()
# The typed schema conf/ names in its defaults lists, in every process that composes a config.
register_schema()
# One dataclass per loss, made from the loss registry (`schema/loss/NAME`).
register_loss_schemas()
