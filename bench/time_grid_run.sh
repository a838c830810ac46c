#!/usr/bin/env bash
# `vlrl run --preset grid-tiny`, the whole episode loop, timed: wall, user and sys seconds (the episode warm start
# included: it is built in a fresh cache that holds only the random tiny model and the tiny preset's own warm start,
# linked from $VLRL_CACHE), the per-episode eval time and the GSPO step times, and the comparison's numbers. User +
# sys is the number to compare on a shared machine (the run uses one thread: OMP_NUM_THREADS=1); the load average
# before and after says how shared it was.
#   VLRL_CACHE=/path/to/cache bash bench/time_grid_run.sh [RUN_DIR]
set -euo pipefail
RUN_DIR=${1:-$(mktemp -d)/grid-tiny}
SOURCE=${VLRL_CACHE:-.cache/vlrl}
FRESH=$(mktemp -d)/vlrl
mkdir -p "$FRESH"
for model in "$SOURCE"/tiny-qwen3-vl-seed0 "$SOURCE"/tiny-qwen3-vl-warm-481bc0e15f5b; do  # base + FORMAT_START
  ln -s "$(realpath "$model")" "$FRESH/"
done
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
VLRL_CACHE=$FRESH OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 /usr/bin/time -f "wall %e s  user %U s  sys %S s" \
  python -m vlrl run --preset grid-tiny --run-dir "$RUN_DIR" > "$RUN_DIR.log" 2>&1 || { tail -20 "$RUN_DIR.log"; exit 1; }
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -E "^wall|^eval:|done in|warm start done" "$RUN_DIR.log"
python - "$RUN_DIR" <<'PY'
import json, sys
run = sys.argv[1]
rows = [r for r in map(json.loads, open(f"{run}/train_log.jsonl")) if "reward" in r]
steps = [r["step_time"] for r in rows]
print(f"GSPO steps: {len(rows)}, mean {sum(steps) / len(steps):.1f} s (TRL's step_time: rollout and update); "
      f"success per step {[round(r['rewards/success/mean'], 2) for r in rows]}")
c = json.load(open(f"{run}/comparison.json"))
print(f"success {c['success_before']:.3f} -> {c['success_after']:.3f} on {c['n_paired']} seeds "
      f"({len(c['failure_to_success'])} failure->success, {len(c['success_to_failure'])} success->failure), "
      f"McNemar exact p = {c['mcnemar_p']:.3g}; mean return {c['return_mean_before']:.3f} -> "
      f"{c['return_mean_after']:.3f}, paired permutation p = {c['return_permutation_p']:.3g}")
PY
