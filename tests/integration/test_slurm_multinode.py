"""Two-node jobs on the local SLURM cluster (`local_cluster.sh start --nodes 2`: nodes dpo-n1 and dpo-n2,
each its own slurmd in its own network and UTS namespace).

One 4-point sweep of 2-node x 2-rank jobs (strategy x precision) serves the rendezvous, mesh, loss and
report checks; one 4-point sweep of identical 2-node jobs serves the events: #0 is preempted twice and
resumes, #1 loses every rank of its second node, #3 every rank of its first (rank 0 among them), #2 runs
through as the reference. Two last 2-node runs each lose a whole node (`local_cluster.sh kill-node`), the
first node (rank 0, the job's batch step) and the second, which is brought back afterwards.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import QUIET, REPO, run_cli, summary_json  # noqa: E402
from support.slurm import checkpoint_after, ensure_slurm_cluster, slurm, wait_for  # noqa: E402
from support.sweeps import FAST, SweepResult, run_sweep  # noqa: E402

from dpo_sweeps.errors import Failure, FailureKind  # noqa: E402
from dpo_sweeps.launchers.jobs import SweepJob  # noqa: E402
from dpo_sweeps.rundir.checkpoints import latest_checkpoint  # noqa: E402
from dpo_sweeps.rundir.summary import Status, Summary, write_summary  # noqa: E402

ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=20",
            "hydra.launcher.poll_interval_s=1"]
TWO_NODES = ["resources.nodes=2", "resources.nproc_per_node=2"]
GRID = ["fsdp=full_shard,hybrid_shard", "precision=fp32,bf16", "train.max_steps=4"]
# A rendezvous the submitting shell happens to have: sbatch passes it on to every job, where it must not
# be used (the address is not the job's first node, and the 4 jobs would all bind the same port).
STALE_MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def _losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in records if "train/loss" in r]


@pytest.fixture(scope="module")
def slurm2() -> dict[str, str]:
    return ensure_slurm_cluster(nodes=2)


@pytest.fixture(scope="module")
def two_node_sweep(slurm2, tmp_path_factory) -> SweepResult:
    sweep_dir = tmp_path_factory.mktemp("two_node") / "sweep"
    result = run_sweep(sweep_dir, *ON_SLURM, *TWO_NODES, *GRID, env={**slurm2, **STALE_MASTER})
    assert result.returncode == 0, result.output[-3000:]
    return result


def test_submitit_rank_takes_the_first_node_over_a_master_addr_already_set(monkeypatch):
    """No cluster needed: the environment SLURM gives rank 2 of a 2-node x 2-task job."""
    from dpo_sweeps.parallel.rank_env import from_submitit_env

    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "4",
                       "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "dpo-n[1-2]",
                       "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                       "RANK": "9"}.items():
        monkeypatch.setenv(key, value)
    env = from_submitit_env()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (2, 4, 0, 2)
    assert env.master_addr == "dpo-n1"
    # the port follows the job id: the same for every rank of the job, another for the next job
    assert 20000 <= env.master_port <= 60000 and env.master_port != 29500
    assert from_submitit_env().master_port == env.master_port
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    assert from_submitit_env().master_port != env.master_port


def test_the_first_tasks_srun_reports_dead_are_named_from_the_job_log():
    """No cluster needed: srun's own lines when a node's tasks are killed and the step is torn down (rank 0
    then dies with it, before it can write summary.json; the launcher names the node from this)."""
    from dpo_sweeps.launchers.forensics import first_dead_tasks

    log = ("[W1201 11:11:23.576 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved.\n"
           "srun: error: dpo-n2: tasks 2-3: Killed\n"
           "srun: launch/slurm: _step_signal: Terminating StepId=156.0\n"
           "srun: error: dpo-n1: task 1: Terminated\n"
           "srun: error: dpo-n1: task 0: Killed\n")
    assert first_dead_tasks(log) == ("dpo-n2", [2, 3], "Killed")
    assert first_dead_tasks("srun: error: n7: tasks 0,4-5: Exited with exit code 1\n") == (
        "n7", [0, 4, 5], "Exited with exit code 1")
    assert first_dead_tasks(log.split("srun: error")[0]) is None


@pytest.mark.slow
@pytest.mark.slurm
def test_srun_on_two_nodes_runs_on_two_hosts(slurm2):
    env = {**os.environ, **slurm2}
    out = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c",
                          'echo "$(hostname) $SLURM_JOB_NODELIST"'],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = sorted(out.split("\n")[:-1])
    hosts = [line.split()[0] for line in lines]
    assert len(set(hosts)) == 2, out
    nodelist = {line.split()[1] for line in lines}
    assert len(nodelist) == 1, out
    expanded = subprocess.run(["scontrol", "show", "hostnames", nodelist.pop()], env=env, capture_output=True,
                              text=True, timeout=30, check=True).stdout.split()
    assert sorted(expanded) == hosts


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_sweep_records_mesh_and_nodes_per_rank(two_node_sweep):
    meshes = {"full_shard": {"shard": 4}, "hybrid_shard": {"replicate": 2, "shard": 2}}
    for n in range(4):
        summary = two_node_sweep.summary(n)
        assert summary["status"] == "completed" and summary["metrics"]["world_size"] == 4
        layout, strategy = summary["layout"], summary["config"]["fsdp"]["sharding_strategy"]
        assert layout["mesh"] == meshes[strategy]
        first, second = layout["nodes"]
        assert first != second
        ranks = layout["ranks"]
        assert [(r["rank"], r["node"], r["local_rank"]) for r in ranks] == [
            (0, first, 0), (1, first, 1), (2, second, 0), (3, second, 1)]
        if strategy == "hybrid_shard":  # replicate across nodes, shard within a node
            assert [r["mesh"] for r in ranks] == [{"replicate": i // 2, "shard": i % 2} for i in range(4)]


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_fp32_losses_equal_a_one_node_four_rank_run(two_node_sweep, tmp_path):
    local = run_cli(tmp_path / "one_node", *FAST[len(QUIET):], "resources.nproc_per_node=4", "fsdp=full_shard",
                    "precision=fp32", "train.max_steps=4")
    assert local.returncode == 0, local.stderr[-3000:]
    reference = local.train_losses()
    assert len(reference) == 4
    compared = 0
    for n in range(4):
        summary = two_node_sweep.summary(n)
        if summary["config"]["precision"]["name"] != "fp32":
            continue
        losses = _losses(two_node_sweep.sweep_dir / str(n))
        assert len(losses) == 4
        for step, (two, one) in enumerate(zip(losses, reference), start=1):
            assert abs(two - one) <= 1e-5 * abs(one), (summary["config"]["fsdp"]["sharding_strategy"], step, two, one)
        compared += 1
    assert compared == 2


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_sweep_is_ranked_by_the_report(two_node_sweep):
    proc = subprocess.run([sys.executable, "analysis/report.py", str(two_node_sweep.sweep_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(two_node_sweep.sweep_dir / "report" / "ranking.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert {row["config"] for row in rows} == {f"fsdp={s} precision={p}" for s in ("full_shard", "hybrid_shard")
                                               for p in ("fp32", "bf16")}


# ---------------------------------------------------------------------------------------- events


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def _job_tasks(job_name: str, array_task: int | None = None, netns: str | None = None, ranks_only: bool = False) -> list[int]:
    """Processes of the job array `job_name` (its batch script, srun, the ranks), optionally of one element,
    on one node; `ranks_only`: only the ranks (the tasks of its job step, not the first node's batch script)."""
    if netns is None:
        pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    else:
        out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30, check=False).stdout
        pids = [int(p) for p in out.split()]
    found = []
    for pid in pids:
        env = _environ(pid)
        if env.get("SLURM_JOB_NAME") != job_name or "SLURM_PROCID" not in env:
            continue
        if ranks_only and "SLURM_STEP_ID" not in env:
            continue
        if array_task is None or env.get("SLURM_ARRAY_TASK_ID") == str(array_task):
            found.append(pid)
    return found


def _queued_after(job_name: str, env: dict, timeout: float) -> str:
    """What squeue shows of the jobs named `job_name` once none of them is COMPLETING any more ("" once they
    left the queue), or after `timeout`. A job pending again (requeued) is returned at once."""
    deadline = time.monotonic() + timeout
    while (queued := slurm("squeue", "-h", "-n", job_name, "-o", "%i %T %r", env=env)) and time.monotonic() < deadline:
        if any(line.split()[1] != "COMPLETING" for line in queued.splitlines()):
            return queued
        time.sleep(1)
    return queued


def _steps_logged(run_dir: Path) -> int:
    try:
        return len(_losses(run_dir))
    except (OSError, ValueError):
        return 0


# Enough steps that scontrol's requeue, sent once run #0's second attempt has saved a checkpoint, reaches it
# with steps still to run on a loaded machine (at 12 CI's second attempt once finished first).
MAX_STEPS = 24
WAIT_S = 600  # the longest wait for one event of a sweep's jobs
COLLECTIVE_TIMEOUT_S = 20
# A killed node ends its run once SLURM marks the node down and requeues the job (NODE_FAIL): local_cluster.sh's
# SlurmdTimeout (30 s), then up to one slurmctld ping round (SlurmdTimeout / 3), then the launcher's poll; the
# rest is slack for a loaded machine (a second xdist worker).
NODE_DOWN_BOUND_S = 30 + 10 + 20


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_preemption_resumes_and_a_lost_node_fails_only_its_run(slurm2, tmp_path):
    env = {**os.environ, **slurm2}
    name = f"dpo-2node-{uuid.uuid4().hex[:8]}"
    sweep_dir, log = tmp_path / "sweep", tmp_path / "sweep.log"
    preempted, lost, reference, lost_first = (sweep_dir / str(n) for n in range(4))
    # Four identical runs (keep_last above the 8 checkpoints of 24 steps changes nothing but the point's name).
    command = [sys.executable, "-m", "dpo_sweeps", "-m", *ON_SLURM, f"hydra.launcher.name={name}", *FAST,
               *TWO_NODES, "fsdp=full_shard", "precision=fp32", f"train.max_steps={MAX_STEPS}",
               "checkpoint.every_steps=3", "checkpoint.keep_when_completed=true", "checkpoint.keep_last=10,11,12,13",
               f"resources.collective_timeout_s={COLLECTIVE_TIMEOUT_S}", f"hydra.sweep.dir={sweep_dir}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        array_id = wait_for("the SLURM jobs", lambda: slurm("squeue", "-h", "-n", name, "-o", "%F", env=env),
                         proc, log, WAIT_S).split()[0]

        # Run #1 loses its second node mid-run: every rank there is killed at once; run #3 its first node's
        # (rank 0, which writes summary.json, and rank 1).
        wait_for("runs #1 and #3 in mid-run", lambda: min(_steps_logged(lost), _steps_logged(lost_first)) >= 2,
                 proc, log, WAIT_S)
        victims = wait_for("the ranks of run #1 on dpo-n2", lambda: _job_tasks(name, 1, "dpo-n2", ranks_only=True),
                           proc, log, WAIT_S)
        first_victims = wait_for("the ranks of run #3 on dpo-n1", lambda: _job_tasks(name, 3, "dpo-n1", ranks_only=True),
                                 proc, log, WAIT_S)
        assert len(victims) == 2 and len(first_victims) == 2, (victims, first_victims)  # ranks 2, 3 and 0, 1
        for pid in victims + first_victims:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()

        # Run #0 gets the preemption signal once it has a checkpoint.
        wait_for("a first checkpoint of run #0", lambda: checkpoint_after(preempted, 0), proc, log, WAIT_S)
        slurm("scancel", "--signal=USR2", f"{array_id}_0", env=env)

        for run_dir in (lost, lost_first):
            failed = wait_for(f"run #{run_dir.name}'s failed summary",
                              lambda d=run_dir: (summary_json(d) or {}).get("status") == "failed", proc, log, WAIT_S)
            lost_after_s = time.monotonic() - killed_at
            assert failed and lost_after_s <= COLLECTIVE_TIMEOUT_S + 30, (run_dir.name, lost_after_s)
            print(f"run #{run_dir.name}: ranks of a node killed -> failed summary.json in {lost_after_s:.1f} s")

        first = wait_for("run #0's preempted summary", lambda: summary_json(preempted), proc, log, WAIT_S)
        assert first["failure"]["kind"] == "preempted", first
        first_stop = first["metrics"]["steps"]
        assert latest_checkpoint(preempted).step == first_stop < MAX_STEPS
        # The requeued job resumed from that checkpoint; once it has saved one more, SLURM requeues it.
        second_ckpt = wait_for("a checkpoint of run #0's second attempt",
                            lambda: checkpoint_after(preempted, first_stop), proc, log, WAIT_S)
        slurm("scontrol", "requeue", f"{array_id}_0", env=env)

        assert proc.wait(timeout=600) != 0, log.read_text()[-3000:]  # runs #1 and #3 failed
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["scancel", "-n", name], env=env, timeout=30, check=False)
    output = log.read_text()

    # The lost ranks: runs #1 and #3 failed naming the node and a rank there; nothing of the sweep is left anywhere.
    for run_dir, node, ranks in ((lost, "dpo-n2", (2, 3)), (lost_first, "dpo-n1", (0, 1))):
        failure = summary_json(run_dir)["failure"]
        assert failure["kind"] in ("node_failure", "crash"), failure
        assert node in failure["message"] and any(f"rank {r}" in failure["message"] for r in ranks), failure
    # SLURM records a job's end while its processes still exit: give them a bound to be gone in
    deadline = time.monotonic() + 60
    while _job_tasks(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {pid: _cmdline(pid) for pid in _job_tasks(name)}
    assert left == {}, "processes of the sweep's jobs are still running"

    # The preempted run resumed twice and ends where the uninterrupted one does.
    done, ref = summary_json(preempted), summary_json(reference)
    assert done["status"] == "completed" and ref["status"] == "completed", output[-3000:]
    assert done["resumed_from_step"] >= second_ckpt > first_stop, (first_stop, second_ckpt, done)
    assert done["layout"]["nodes"] == ref["layout"]["nodes"] == ["dpo-n1", "dpo-n2"]
    assert _losses(preempted) == _losses(reference)
    same = [k for k in ref["metrics"] if k.startswith(("train/", "eval/"))] + ["steps", "world_size"]
    assert {k: done["metrics"][k] for k in same} == {k: ref["metrics"][k] for k in same}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize(("node", "first_rank", "silent"), [("dpo-n1", 0, False), ("dpo-n2", 2, False),
                                                         ("dpo-n1", 0, True)])
def test_a_node_lost_with_its_slurmd_fails_the_run_as_node_failure(slurm2, tmp_path, node, first_rank, silent):
    """Everything of one node killed at once (`local_cluster.sh kill-node`: slurmd, job steps, ranks), as
    when a machine dies: the run fails `node_failure` naming it once SLURM marks the node down, and SLURM's
    own requeue of the job is cancelled. The first node holds rank 0 (which writes summary.json in a
    healthy run) and the job's batch step: a rank of the second node writes the failed summary instead.
    Lost silently (its link cut first, as a machine without power), the node leaves the other ranks
    waiting in a collective (timeout 300 s) until SLURM kills them: the launcher names the node and rank 0
    from the heartbeats."""
    from support import isolation
    from support.slurm import SCRIPT

    env = {**os.environ, **slurm2}
    name = f"dpo-lost-{uuid.uuid4().hex[:8]}"
    sweep_dir, log = tmp_path / "sweep", tmp_path / "sweep.log"
    run_dir = sweep_dir / "0"
    command = [sys.executable, "-m", "dpo_sweeps", "-m", *ON_SLURM, f"hydra.launcher.name={name}", *FAST,
               *TWO_NODES, "train.max_steps=200",
               f"resources.collective_timeout_s={300 if silent else COLLECTIVE_TIMEOUT_S}",
               f"hydra.sweep.dir={sweep_dir}"]
    # slurmctld's pings of a silent node go unanswered rather than refused: each waits out its own timeout
    bound_s = NODE_DOWN_BOUND_S + (30 if silent else 0)
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("the run in mid-run", lambda: _steps_logged(run_dir) >= 2, proc, log, WAIT_S)
        subprocess.run(["bash", str(SCRIPT), "kill-node", node, *(["--silent"] if silent else []),
                        slurm2["DPO_SWEEPS_SLURM_STATE_DIR"]], check=True, capture_output=True, timeout=60)
        killed_at = time.monotonic()
        proc.wait(timeout=bound_s + 60)
        ended_after_s = time.monotonic() - killed_at
        # SLURM requeued the job (NODE_FAIL, JobRequeue=1): cancelled, it leaves the queue once the node left
        # has completed it; left requeued, it would pend until the node is back and run again. The node left
        # completes it late after a silent loss: its step first waits out each task-exit message to the srun
        # of the lost node ("No route to host"), tens of seconds on a loaded machine.
        queued = _queued_after(name, env, 180)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["scancel", "-n", name], env=env, timeout=30, check=False)
        # the node comes back for the tests after this one
        subprocess.run(["bash", str(SCRIPT), "start", "--nodes", slurm2["DPO_SWEEPS_SLURM_NODES"],
                        slurm2["DPO_SWEEPS_SLURM_STATE_DIR"]], check=True, capture_output=True, timeout=300,
                       env=isolation.start().service_env())  # the restarted slurmd outlives this session
    print(f"node killed -> sweep ended in {ended_after_s:.1f} s")
    assert ended_after_s <= bound_s, log.read_text()[-3000:]
    summary = summary_json(run_dir)
    failure = summary["failure"]
    assert failure["kind"] == "node_failure", failure
    assert failure["rank"] == first_rank and node in failure["message"] and f"rank {first_rank}" in failure["message"], failure
    assert (summary.get("written_by") == "launcher") == silent, summary.get("written_by")
    assert ("heartbeats stopped" in failure["message"]) == silent, failure
    assert queued == "", queued  # SLURM's requeue of it was cancelled
    assert _job_tasks(name) == []


def test_a_failed_run_that_slurm_requeued_is_cancelled_but_a_preempted_one_is_not(tmp_path):
    """No cluster needed: the launcher's rule for a job SLURM holds pending again after a node failure."""
    from dpo_sweeps.launchers.slurm.launcher import failed_but_held

    class Held:  # what the launcher reads of a submitit job: its SLURM state
        state = "PENDING"

    def failed(kind: FailureKind, message: str, attempt: str) -> None:
        write_summary(tmp_path, Summary(Status.FAILED, Failure(kind, message), [], {}, {}, attempt=attempt))

    job = SweepJob(num=0, overrides=[], config=None, task_config={}, config_hash="", run_dir=tmp_path)
    assert not failed_but_held(job, Held(), "a1")  # no summary yet: the job has not run
    failed(FailureKind.PREEMPTED, "SIGUSR2", "a1")
    assert not failed_but_held(job, Held(), "a1")  # requeued to resume: leave it
    failed(FailureKind.CRASH, "a peer rank stopped", "a0")
    assert not failed_but_held(job, Held(), "a1")  # the summary of an earlier attempt (an earlier sweep's)
    assert failed_but_held(job, Held(), "a0")
    Held.state = "RUNNING"
    assert not failed_but_held(job, Held(), "a0")
