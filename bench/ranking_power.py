"""Does the report's tied set hold the true best, separate a worse config, and stay quiet when all are equal?

    python bench/ranking_power.py                    # 1,000 simulated sweeps per cell, a few minutes on 2 cores
    python bench/ranking_power.py --sweeps 200       # a quicker look
    python bench/ranking_power.py --pairs 2000 --seeds 2 --sweeps 5000 --seed 1   # one cell, closer
    python bench/ranking_power.py --seed-shift 0.2 --pairs 1000 --seeds 1 2 3      # seeds that move every pair

A simulation with known truth, run through the report's own comparison (dpo_sweeps/ranking/ties.py's
`compare_with_best`, the function rank_sweep calls), not a copy of it. Each simulated sweep has K configs
scored on the same n held-out pairs with 1-3 seeds each. Outcomes are correlated between configs as real
ones are: pair i is ranked right by seed s of config c when

    difficulty_i + own_(c,i) + noise_(c,i,s) + seed_(c,s) + shift_c > 0,

with a pair difficulty shared by every config, a per-config pair effect shared by its seeds, a seed's
noise on each pair, and (with --seed-shift) a seed's shift of every pair at once, a better or worse trained
model; shift_c sets config c's true accuracy. Two truths:
- spread: accuracies 0.70 (the true best), 0.69, 0.67, 0.65: is the true best in the tied set, and is
  the config 5 points worse outside it?
- equal: four configs at 0.70: does any config come out significantly better than another?

The bootstrap is skipped (`resamples=0`): the tied decision and the ranks use the tests and Holm's
adjustment alone, and the intervals are what costs time. gc.freeze() keeps statsmodels' multipletests,
which runs gc.collect() on every call, from walking the whole heap thousands of times.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpo_sweeps.ranking.eval_pairs import LOG_RATIO_MARGIN, PairRecords  # noqa: E402
from dpo_sweeps.ranking.ties import ConfigEval, compare_with_best  # noqa: E402

TRUTHS = {"spread": (0.70, 0.69, 0.67, 0.65), "equal": (0.70, 0.70, 0.70, 0.70)}
WORSE_BY_5 = 3  # the index of the config 5 points below the best in `spread`
PAIRS = (256, 1000, 2000)
SEEDS = (1, 2, 3)
# Standard deviations of the shared difficulty, a config's own pair effect and a seed's noise: the latent
# correlation between two configs is 1 / (1 + 0.6^2 + 0.4^2), about 0.66, and about 0.45 between their 0/1
# outcomes at these accuracies (Miller 2024 reports 0.3-0.7 between models on shared items).
DIFFICULTY, OWN, NOISE = 1.0, 0.6, 0.4


def simulate(accuracies: tuple[float, ...], n: int, seeds: int, rng: np.random.Generator,
             ids: np.ndarray, seed_shift: float = 0.0) -> list[ConfigEval]:
    scale = np.sqrt(DIFFICULTY**2 + OWN**2 + NOISE**2 + seed_shift**2)
    difficulty = rng.normal(0, DIFFICULTY, size=(n, 1))
    configs = []
    for c, accuracy in enumerate(accuracies):
        latent = difficulty + rng.normal(0, OWN, size=(n, 1)) + rng.normal(0, NOISE, size=(n, seeds))
        if seed_shift:
            latent = latent + rng.normal(0, seed_shift, size=(1, seeds))
        correct = (latent + norm.ppf(accuracy) * scale > 0).astype(np.float64)
        records = PairRecords(ids, correct, latent, LOG_RATIO_MARGIN, n)
        configs.append(ConfigEval(f"config {c}", float(correct.mean()), records, n, seeds))
    return configs


def run_cell(truth: str, n: int, seeds: int, sweeps: int, seed: int, seed_shift: float = 0.0) -> dict[str, float]:
    rng = np.random.default_rng([seed, n, seeds, len(truth)])
    ids = np.array([f"{i:08x}" for i in range(n)])
    best_tied = worse_out = any_claim = 0
    mdd = []
    for _ in range(sweeps):
        quality = compare_with_best(simulate(TRUTHS[truth], n, seeds, rng, ids, seed_shift), resamples=0)
        best_tied += quality.versus[0].tied_with_best
        worse_out += not quality.versus[WORSE_BY_5].tied_with_best
        any_claim += bool(quality.better.any())
        mdd.append(quality.resolution.minimum_detectable_difference)
    return {"best_tied": best_tied / sweeps, "worse_out": worse_out / sweeps, "any_claim": any_claim / sweeps,
            "mdd": float(np.nanmedian(mdd))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=1000, help="simulated sweeps per cell (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, nargs="+", default=list(PAIRS), help="held-out pairs per cell")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="seeds per config per cell")
    parser.add_argument("--seed-shift", type=float, default=0.0,
                        help="standard deviation of a seed's shift of every pair's latent (default 0: none)")
    args = parser.parse_args(argv)
    # One sweep first, so that the libraries it imports are in the heap gc.freeze() sets aside.
    run_cell("equal", PAIRS[0], 1, 1, args.seed)
    gc.freeze()
    started = time.perf_counter()
    shift = f", seed shift {args.seed_shift}" if args.seed_shift else ""
    print(f"{args.sweeps} simulated sweeps per cell, {len(TRUTHS['spread'])} configs{shift}; targets: true best tied "
          ">= 95%, 5 points worse separated >= 80% at n = 2000, any claim with all equal <= 5%\n")
    print("| pairs | seeds | true best in the tied set | 5 points worse outside it | "
          "any 'significantly better' (all equal) | resolvable difference (median) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.pairs:
        for seeds in args.seeds:
            spread = run_cell("spread", n, seeds, args.sweeps, args.seed, args.seed_shift)
            equal = run_cell("equal", n, seeds, args.sweeps, args.seed, args.seed_shift)
            print(f"| {n} | {seeds} | {100 * spread['best_tied']:.1f}% | {100 * spread['worse_out']:.1f}% | "
                  f"{100 * equal['any_claim']:.1f}% | {100 * spread['mdd']:.1f} points |", flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
