#!/usr/bin/env bash
# Every GPU path of dpo-sweeps on a machine with one GPU, in under 8 minutes, with no network:
#
#   bash bench/gpu_check.sh OUT_DIR          # on the GPU machine (resources.device=cuda)
#   bash bench/gpu_check.sh --cpu OUT_DIR    # the same checks at tiny sizes on a CPU (CI runs this)
#
# Checks, each a real run of the CLI on one rank:
#   1. each precision (fp32, bf16, fp16) of tiny_llama: completes, step-1 loss (ln 2 = 0.693147), MFU;
#   2. a 1B-class bf16 run (bench/gpu_dpo.py, the Llama-3.2-1B shape): tokens/s, MFU, peak memory
#      against memory_estimate.py's estimate (--cpu: gpu_dpo.py --tiny);
#   3. a 2-job local sweep (precision=fp32,bf16), the jobs one after the other on the one GPU;
#   4. kill and resume: a run SIGKILLed after its step-2 checkpoint, then the same command again,
#      which resumes from step 2 and completes.
# Every row also records the measured step time beside the predicted one (dpo_sweeps/cost/, on the profile
# of the GPU it ran on, with its interval): the first GPU measurement checks the predictor too.
# Writes OUT_DIR/results.md (one row per check), OUT_DIR/summaries/*.json (every run's summary.json),
# OUT_DIR/logs/ and the run directories under OUT_DIR/runs/. Exit status 1 if any check failed.
# What to bring to an offline GPU machine: bench/README.md ("GPU check").
set -uo pipefail

DEVICE=cuda
if [[ "${1:-}" == "--cpu" ]]; then DEVICE=cpu; shift; fi
if [[ $# -ne 1 ]]; then
    echo "usage: bash bench/gpu_check.sh [--cpu] OUT_DIR" >&2
    exit 2
fi
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
RUNS="$OUT/runs"
mkdir -p "$RUNS" "$OUT/summaries" "$OUT/logs"
cd "$REPO"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
export DPO_SWEEPS_CACHE="$OUT/cache"
PY="${PYTHON:-python}"

COMMON=(wandb.mode=disabled train.progress_bar=false train.save_model=false "resources.device=$DEVICE"
        resources.nproc_per_node=1 model=tiny_llama)
if [[ $DEVICE == cuda ]]; then
    SIZE=(train.max_steps=20 train.batch_size=32 train.micro_batch_size=8 perf.warmup_steps=5
          data.num_train_pairs=1024 data.num_eval_pairs=64 train.eval_every=0)
    DPO_ARGS=(--precisions bf16 --no-baseline)
else
    SIZE=(train.max_steps=3 train.batch_size=8 train.micro_batch_size=4 perf.warmup_steps=1
          data.num_train_pairs=64 data.num_eval_pairs=8 train.eval_every=0)
    DPO_ARGS=(--tiny --precisions bf16 --no-baseline)
fi
ROWS="$OUT/rows.jsonl"
: > "$ROWS"
started=$SECONDS

# row CHECK RUN_DIR [NOTE]: one line of results.md from a run's summary.json (copied to summaries/).
row() {
    local check=$1 run_dir=$2 note=${3:-}
    [[ -f "$run_dir/summary.json" ]] && cp "$run_dir/summary.json" "$OUT/summaries/$check.json"
    "$PY" - "$check" "$run_dir" "$note" >> "$ROWS" <<'PY'
import json, sys
from pathlib import Path
check, run_dir, note = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
metrics_log = run_dir / "metrics.jsonl"
losses = [json.loads(l).get("train/loss") for l in metrics_log.read_text().splitlines()] if metrics_log.exists() else []
m = summary.get("metrics", {})
print(json.dumps({"check": check, "status": summary.get("status", "no summary.json"),
                  "failure": (summary.get("failure") or {}).get("message"), "step1_loss": next((l for l in losses if l is not None), None),
                  "tokens_per_s": m.get("perf/tokens_per_s"), "mfu": m.get("perf/mfu"), "mfu_reason": m.get("perf/mfu_reason"),
                  "peak_gib": m.get("perf/peak_memory_gib"), "estimate_gib": m.get("perf/peak_memory_estimate_gib"),
                  "resumed_from_step": summary.get("resumed_from_step"), "note": note,
                  "step_s": m.get("perf/step_time_s"), "predicted_s": m.get("perf/step_time_predicted_s"),
                  "predicted_low_s": m.get("perf/step_time_predicted_low_s"),
                  "predicted_high_s": m.get("perf/step_time_predicted_high_s")}))
PY
}

cli() {  # cli LOG_NAME [-m] OVERRIDES...: one run (-m: a sweep) of the CLI, its output to logs/LOG_NAME.log
    local name=$1 mode=(); shift
    if [[ "${1:-}" == -m ]]; then mode=(-m); shift; fi
    "$PY" -m dpo_sweeps "${mode[@]}" "${COMMON[@]}" "${SIZE[@]}" "$@" > "$OUT/logs/$name.log" 2>&1
}

"$PY" - "$DEVICE" > "$OUT/environment.txt" <<'PY'
import platform, sys
import torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, requested {sys.argv[1]}")
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
cat "$OUT/environment.txt"

# 1. Each precision on one rank.
for precision in fp32 bf16 fp16; do
    echo "[gpu_check] precision=$precision"
    cli "precision_$precision" "precision=$precision" "hydra.run.dir=$RUNS/precision_$precision"
    row "precision_$precision" "$RUNS/precision_$precision"
done

# 2. A 1B-class bf16 run (tiny on a CPU): tokens/s, MFU, peak memory against the estimate.
echo "[gpu_check] 1B-class bf16 (bench/gpu_dpo.py ${DPO_ARGS[*]})"
"$PY" bench/gpu_dpo.py "${DPO_ARGS[@]}" --device "$DEVICE" --workdir "$RUNS/gpu_dpo" > "$OUT/logs/gpu_dpo.log" 2>&1
row "llama1b_bf16" "$RUNS/gpu_dpo/bf16" "bench/gpu_dpo.py ${DPO_ARGS[*]}"

# 3. A two-job local sweep.
echo "[gpu_check] 2-job local sweep"
cli sweep -m precision=fp32,bf16 "hydra.sweep.dir=$RUNS/sweep"
for job in 0 1; do row "sweep_job$job" "$RUNS/sweep/$job" "local launcher"; done

# 4. Kill and resume: SIGKILL at step 3 (after the step-2 checkpoint), then the same command again.
echo "[gpu_check] kill and resume (the first attempt is killed on purpose)"
RESUME=(precision=bf16 train.max_steps=4 checkpoint.every_steps=2 faults.kind=sigkill faults.step=3
        "hydra.run.dir=$RUNS/resume")
cli resume_killed "${RESUME[@]}"
killed=$?
cli resume "${RESUME[@]}"
row "kill_and_resume" "$RUNS/resume" "first attempt exit $killed (SIGKILL: 137)"

"$PY" - "$ROWS" "$OUT/results.md" "$OUT/environment.txt" "$((SECONDS - started))" <<'PY'
import json, math, sys
from pathlib import Path
rows = [json.loads(l) for l in Path(sys.argv[1]).read_text().splitlines()]
env, wall = Path(sys.argv[3]).read_text().strip(), sys.argv[4]

def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

def predicted(r):
    """The predicted step time (dpo_sweeps/cost/, on the GPU's own profile) with its interval and error."""
    if not isinstance(r.get("predicted_s"), (int, float)):
        return "-"
    error = f" ({100 * (r['predicted_s'] - r['step_s']) / r['step_s']:+.0f}%)" if r.get("step_s") else ""
    return f"{r['predicted_s']:.4g} [{r['predicted_low_s']:.4g}-{r['predicted_high_s']:.4g}]{error}"

ok = []
for r in rows:
    good = r["status"] == "completed"
    if r["check"] == "kill_and_resume":
        good = good and r["resumed_from_step"] == 2
    ok.append(good)
lines = [f"{env.replace(chr(10), '; ')}; {wall} s in all", "",
         "| check | result | step-1 loss | tokens/s | MFU | peak GiB | estimate GiB | step s | predicted s [interval] | note |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for r, good in zip(rows, ok):
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else f"- ({r['mfu_reason']})" if r["mfu_reason"] else "-"
    note = "; ".join(x for x in (r["note"], f"resumed from step {r['resumed_from_step']}" if r["resumed_from_step"] else "",
                                 r["failure"] or "") if x)
    lines.append(f"| {r['check']} | {'ok' if good else 'FAILED: ' + r['status']} | {fmt(r['step1_loss'], '.6f')} "
                 f"| {fmt(r['tokens_per_s'], '.0f')} | {mfu} | {fmt(r['peak_gib'], '.3f')} | {fmt(r['estimate_gib'], '.3f')} "
                 f"| {fmt(r['step_s'], '.4g')} | {predicted(r)} | {note} |")
lines.append("")
lines.append(f"{sum(ok)} of {len(ok)} checks passed (ln 2 = {math.log(2):.6f})")
Path(sys.argv[2]).write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if all(ok) else 1)
PY
