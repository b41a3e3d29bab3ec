"""One Optuna study, two SLURM jobs each running a sweep on it (a journal file on the shared filesystem)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from support import REPO, cli_env
from support.slurm import ensure_slurm_cluster
from support.sweeps import FAST

from dpo_sweeps.train.study_storage import open_storage

optuna = pytest.importorskip("optuna")


@pytest.mark.slurm
@pytest.mark.slow
def test_two_slurm_jobs_each_running_a_sweep_share_one_study(tmp_path):
    # The session's own caches (cli_env), not the user's: the sweeps sbatch starts cache reference log-probs.
    env = {**cli_env(), **ensure_slurm_cluster(nodes=2)}
    sweep_dir = tmp_path / "study"
    journal = sweep_dir / "optuna.journal"
    sweep_dir.mkdir()
    sweep = [sys.executable, "-m", "dpo_sweeps", "-m", *FAST, "hydra/sweeper=optuna", "resources.nproc_per_node=1",
             "train.max_steps=2", "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage=journal:{journal}",
             "hydra.sweeper.sampler.seed=0", "loss.beta=interval(0.05, 0.5)", f"hydra.sweep.dir={sweep_dir}"]
    command = f"cd {shlex.quote(str(REPO))} && {shlex.join(sweep)}"
    workers = [subprocess.Popen(["sbatch", "--wait", "-N1", "-n1", "-c2", "-w", node, "-J", "optuna-worker",
                                 "-o", str(tmp_path / f"{node}.out"), "--wrap", command],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for node in ("dpo-n1", "dpo-n2")]
    for worker, node in zip(workers, ("dpo-n1", "dpo-n2")):
        output, _ = worker.communicate(timeout=600)
        assert worker.returncode == 0, output + (tmp_path / f"{node}.out").read_text()[-3000:]
    trials = optuna.load_study(study_name="dpo_sweeps", storage=open_storage(f"journal:{journal}")).trials
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(4)]
    assert len({t.params["loss.beta"] for t in trials}) == 4
    logs = [(tmp_path / f"{node}.out").read_text() for node in ("dpo-n1", "dpo-n2")]
    ran = [sorted(int(n) for n in re.findall(r"\] trial (\d+): ", log)) for log in logs]
    assert len(ran[0]) == len(ran[1]) == 2 and sorted(ran[0] + ran[1]) == [0, 1, 2, 3]  # each job ran its own two
