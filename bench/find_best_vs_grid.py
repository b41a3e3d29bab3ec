"""The staged search against the full grid: the same settings, both recommendations, the compute each spent.

    python bench/find_best_vs_grid.py                 # how long: bench/README.md
    python bench/find_best_vs_grid.py --reuse DIR     # re-read the two sweeps of an earlier invocation
    python bench/find_best_vs_grid.py --model smollm2_135m    # pretrained SmolLM2-135M-Instruct on HH
    python bench/find_best_vs_grid.py --model smollm2_135m --smoke   # minutes: 2 points, 2 steps (it starts)
    python bench/find_best_vs_grid.py --cluster cpu   # stage 0 on: the plans ranked by prediction first
    python bench/find_best_vs_grid.py --model smollm2_135m --systems fsdp=full_shard,shard_grad_op \
        precision=fp32 train.micro_batch_size=2,4       # another plan grid (here: no bf16)

Settings (tiny GPT-2, synthetic data, 2 ranks, 60 steps; or --model smollm2_135m, see MODELS): the
parallel plan fsdp {full_shard, shard_grad_op} x precision {fp32, bf16} and the algorithm loss {dpo, ipo}
x loss.beta {0.1, 0.5} (SmolLM2: dpo x loss.beta {0.1, 0.5}; ALGORITHMS). The full grid trains all 16
(SmolLM2: 8) points. The staged search (hydra.sweeper.stages) probes the 4 plans and
trains the algorithm settings on the best `--top-k` plans. Both recommendations follow the same rule
(launchers/find_best.py: of the configs tied with the best preference accuracy on the held-out pairs,
the best speed per memory). Compute is the summed `device_seconds` of every run
(ranks x wall time). The staged search's pick counts as equivalent when it is the grid's pick, or
when it is tied with the grid's best accuracy and its plan's speed per memory is within
the spread (mean - std, over the grid's runs of that plan) of the grid pick's plan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpo_sweeps.launchers.find_best_answer import Decision, accuracy_text, candidates_of  # noqa: E402

COMMON = ["resources.nproc_per_node=2", "perf.warmup_steps=2", "train.save_model=false", "train.progress_bar=false",
          "tracking.wandb.mode=disabled", "hydra.launcher.max_concurrent_jobs=1"]
HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
# Per --model: what every run of both sweeps trains. SmolLM2 (pretrained, chat template) on HH harmless at a
# short budget: 20 steps of 8 pairs, 128 tokens, 64 held-out pairs.
MODELS = {
    "tiny_gpt2": ["model=tiny_gpt2", "data=synthetic", "train.max_steps=60", "train.eval_every=20"],
    "smollm2_135m": ["model=smollm2_135m", "data=hh", f"data.path={HH}", "data.eval_size=64",
                     "data.max_length=128", "data.max_prompt_length=64", "train.batch_size=8",
                     "train.micro_batch_size=2", "train.lr=3e-5", "train.warmup_steps=2", "train.max_steps=20",
                     "train.eval_every=10"],
}
SYSTEMS = {"fsdp": "full_shard,shard_grad_op", "precision": "fp32,bf16"}
# The algorithm grid per --model: 4 settings on the toy (16 points with the 4 plans); 2 on SmolLM2, whose
# runs cost minutes each on a CPU (8 points: the minimum).
ALGORITHMS = {"tiny_gpt2": {"loss": "dpo,ipo", "loss.beta": "0.1,0.5"},
              "smollm2_135m": {"loss": "dpo", "loss.beta": "0.1,0.5"}}
# --smoke: that the comparison runs at all, in minutes.
SMOKE_SYSTEMS, SMOKE_ALGORITHM = {"fsdp": "full_shard", "precision": "fp32"}, {"loss": "dpo", "loss.beta": "0.1,0.5"}
SMOKE = ["train.max_steps=2", "train.eval_every=0", "perf.warmup_steps=0", "train.eval_max_pairs=8"]


def sweep(sweep_dir: Path, base: list[str], extra: list[str]) -> None:
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *base, *extra, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sweep into {sweep_dir} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def summaries(sweep_dir: Path) -> list[tuple[Path, dict]]:
    return [(p.parent, json.loads(p.read_text())) for p in sorted(sweep_dir.rglob("summary.json"))]


def plan_of(summary: dict) -> tuple[str, str, int]:
    config = summary["config"]
    return config["fsdp"]["sharding_strategy"], config["precision"]["name"], config["train"]["micro_batch_size"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--probe-steps", type=int, default=10)
    parser.add_argument("--reuse", type=Path, help="a folder holding grid/ and find_best/ from an earlier run")
    parser.add_argument("--model", default="tiny_gpt2", choices=sorted(MODELS))
    parser.add_argument("--smoke", action="store_true", help="2 points of 2 steps: that it runs, no figures")
    parser.add_argument("--systems", nargs="+", metavar="KEY=V1,V2",
                        help="the plan grid instead of SYSTEMS, e.g. precision=fp32 train.micro_batch_size=2,4 on a "
                             "CPU without bf16 instructions, where a bf16 run costs hours")
    parser.add_argument("--cluster", default=None,
                        help="stage 0 on: find_best ranks the plans on this cluster profile (cluster=cpu: this "
                             "machine, measured) and probes only those within --predict-keep of the best")
    parser.add_argument("--predict-keep", type=float, default=1.5)
    args = parser.parse_args()
    base = [*MODELS[args.model], *COMMON, *(SMOKE if args.smoke else [])]
    chosen = dict(s.split("=", 1) for s in args.systems) if args.systems else SYSTEMS
    systems, algorithm = (SMOKE_SYSTEMS, SMOKE_ALGORITHM) if args.smoke else (chosen, ALGORITHMS[args.model])
    base = [o for o in base if o.split("=", 1)[0] not in systems]  # the plan grid sets these
    probe_steps, top_k = (2, 1) if args.smoke else (args.probe_steps, args.top_k)
    root = args.reuse or Path(tempfile.mkdtemp(prefix="find-best-vs-grid-"))
    grid_dir, staged_dir = root / "grid", root / "find_best"
    if args.reuse is None:
        sweep(grid_dir, base, [f"{k}={v}" for k, v in {**systems, **algorithm}.items()])
        stages = ("{systems: {" + ", ".join(f"{k}: '{v}'" for k, v in systems.items()) + "}, algorithm: {"
                  + ", ".join(f"{k}: '{v}'" for k, v in algorithm.items())
                  + f"}}, probe_steps: {probe_steps}, top_k: {top_k}, predict_keep: {args.predict_keep}}}")
        stage_zero = [f"cluster={args.cluster}"] if args.cluster else []
        sweep(staged_dir, base, [f"hydra.sweeper.stages={stages}", *stage_zero])

    grid = summaries(grid_dir)
    staged = summaries(staged_dir)
    grid_candidates = candidates_of([(d, None) for d, _ in grid])
    grid_pick = Decision.of(grid_candidates).recommendation()
    staged_pick = json.loads((staged_dir / "find_best.json").read_text())["recommendation"]
    cost = {name: sum(s.get("device_seconds") or 0.0 for _, s in runs) for name, runs in (("grid", grid), ("staged", staged))}

    by_plan: dict[tuple[str, str], list[float]] = {}
    for _, s in grid:
        if s["status"] == "completed":
            by_plan.setdefault(plan_of(s), []).append(s["metrics"]["perf/speed_per_memory"])
    grid_pick_summary = json.loads((Path(grid_pick["run"]) / "summary.json").read_text())
    staged_summary = json.loads((Path(staged_pick["run"]) / "summary.json").read_text())
    pick_plan, staged_plan = plan_of(grid_pick_summary), plan_of(staged_summary)
    speeds = by_plan[pick_plan]
    speed_floor = statistics.mean(speeds) - (statistics.stdev(speeds) if len(speeds) > 1 else 0.0)
    same = grid_pick_summary["config_hash"] == staged_summary["config_hash"]
    # The staged pick against the grid's configs, by the same test: tied with the grid's best?
    staged_candidate = candidates_of([(Path(staged_pick["run"]), None)])
    together = Decision.of(grid_candidates + staged_candidate)
    accuracy_ok = staged_candidate[0] in together.tied
    speed_ok = statistics.mean(by_plan[staged_plan]) >= speed_floor

    print(f"runs in {root}")
    for name, pick, runs in (("full grid", grid_pick, grid), ("find_best", staged_pick, staged)):
        print(f"{name:10} {len(runs):3} runs, {cost['grid' if name == 'full grid' else 'staged']:8.0f} device-seconds; "
              f"recommends accuracy {accuracy_text(pick)}, "
              f"{pick['perf/speed_per_memory']:,.0f} tok/s/GiB: {pick['command']}")
    print(f"find_best spent {100 * cost['staged'] / cost['grid']:.1f}% of the full grid's compute; its pick is "
          + ("the grid's own" if same else f"{'tied with' if accuracy_ok else 'worse than'} the grid's best accuracy and "
             f"{'within' if speed_ok else 'outside'} its speed spread"))


if __name__ == "__main__":
    main()
