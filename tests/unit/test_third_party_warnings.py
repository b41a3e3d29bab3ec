"""The third-party warnings a run filters (dpo_sweeps/errors.py): those the user can do nothing about, and
no other, once per process."""

from __future__ import annotations

import subprocess
import sys

from support import cli_env

# A process that imported dpo_sweeps (twice, and asked again: the filters go in once) reads transformers'
# deprecated property, as peft does for every model it wraps; then transformers' module warns of a setting.
PROGRAM = """
import warnings
import dpo_sweeps.errors
from dpo_sweeps.errors import quiet_third_party
import dpo_sweeps.errors
quiet_third_party()
from transformers import GPT2Config, GPT2LMHeadModel, modeling_utils
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
model.is_gradient_checkpointing
exec("warnings.warn('`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.', "
     "FutureWarning)", {**vars(modeling_utils), "warnings": warnings})
print(sum(1 for f in warnings.filters if f[1] is not None and "is_gradient_checkpointing" in f[1].pattern))
"""


def test_a_library_deprecation_is_filtered_once_and_a_warning_naming_a_setting_is_not():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1"]  # one filter, however often it was asked for
    assert "is_gradient_checkpointing" not in proc.stderr
    assert "FutureWarning: `use_cache=True` is incompatible" in proc.stderr  # same module, same category: shown
