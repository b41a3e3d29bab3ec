"""The time a run was launched, the same on every rank: `${launch_time:FORMAT}` in conf/config.yaml.

Hydra's `${now:}` is read by each process from its own clock, so the ranks torchrun starts, each
composing its own config, could land in run directories a second apart. Under torchrun the ranks
agree through the store its agent hosts for them (TORCHELASTIC_USE_AGENT_STORE, torchrun's default;
the store torch.distributed's env:// rendezvous also uses): the first rank to ask sets the time, and
every rank reads that one. A restart of the same torchrun (--max-restarts) gets the same time, so it
resumes in the same directory. Elsewhere there is one process to ask, and its clock is the answer.
"""

from __future__ import annotations

import datetime
import os

from omegaconf import OmegaConf

STORE_KEY = "dpo_sweeps/launch_time"
STORE_TIMEOUT_S = 120


def launch_time() -> datetime.datetime:
    """The launch time of this run: agreed with the other ranks under torchrun, else this clock's now."""
    env = os.environ
    now = datetime.datetime.now().isoformat()
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and {"MASTER_ADDR", "MASTER_PORT"} <= env.keys():
        import torch.distributed as dist

        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
        # Sets the key only where it is not set yet; returns what the store holds.
        now = store.compare_set(f"{STORE_KEY}/{env.get('TORCHELASTIC_RUN_ID', '')}", "", now).decode()
    return datetime.datetime.fromisoformat(now)


def register_resolver() -> None:
    OmegaConf.register_new_resolver("launch_time", lambda pattern: launch_time().strftime(pattern),
                                    use_cache=True, replace=True)
