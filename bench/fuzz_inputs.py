"""The bad-input fuzzer, long: many random data files and override sets (tests/support/fuzz.py), each
checked in-process as the CI test checks a few, and the override sets the checks accept run through the
real CLI for one step (`--cli`, the first N of them: each is a process); prints how many inputs it tried,
their outcomes, and every input that broke the property (a traceback, a message over one line, more or
fewer than one error line, a file of the user's changed).

    python bench/fuzz_inputs.py                       # 2,000 data files, 1,000 override sets, 50 CLI runs
    python bench/fuzz_inputs.py --files 200 --overrides 100 --cli 20 --seed 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from support.fuzz import OVERRIDE_SETS, check_data_file, check_overrides, data_files, run_overrides  # noqa: E402


def fuzz(name: str, strategy, check, examples: int, random_seed: int) -> tuple[Counter, list[str]]:
    outcomes: Counter = Counter()
    broken: list[str] = []

    @seed(random_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        try:
            outcomes[check(example)] += 1
        except Exception as exc:  # the property broke: record and go on
            outcomes["BROKEN"] += 1
            broken.append(f"{name}: {example!r:.300} -> {type(exc).__name__}: {str(exc)[:300]}")

    run()
    return outcomes, broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--overrides", type=int, default=1000)
    parser.add_argument("--cli", type=int, default=50, help="accepted override sets run through the CLI")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    broken_all = []
    cli_runs: list[int] = []

    def check_and_run(overrides: list[str]) -> str:
        verdict = check_overrides(overrides)
        if verdict != "accepted" or len(cli_runs) >= args.cli:
            return verdict
        cli_runs.append(1)
        with tempfile.TemporaryDirectory() as run_folder:
            return f"accepted, then {run_overrides(overrides, Path(run_folder))}"

    with tempfile.TemporaryDirectory() as folder:
        for name, strategy, check, n in (
            ("data files", data_files(), lambda f: check_data_file(Path(folder), *f), args.files),
            ("override sets", OVERRIDE_SETS, check_and_run, args.overrides),
        ):
            if n <= 0:  # --files 0: only the override sets
                continue
            start = time.perf_counter()
            outcomes, broken = fuzz(name, strategy, check, n, args.seed)
            broken_all += broken
            total = sum(outcomes.values())
            print(f"{name}: {total} tried in {time.perf_counter() - start:.0f} s; "
                  + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    for line in broken_all:
        print("BROKEN", line)
    return 1 if broken_all else 0


if __name__ == "__main__":
    sys.exit(main())
