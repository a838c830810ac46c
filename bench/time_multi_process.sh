#!/usr/bin/env bash
# `vlrl run --preset tiny` in one process against two (accelerate launch, the shipped DDP config, gloo on CPU), warm
# tiny model already cached in $VLRL_CACHE: wall, user and sys seconds of the whole loop, and the GSPO step times
# from train_log.jsonl. One thread per process (OMP_NUM_THREADS=1), so the two-process run uses both cores of a
# 2-core machine and the one-process run one of them; results in bench/results/multi_process.md.
#   bash bench/time_multi_process.sh [OUT_DIR]
set -euo pipefail
OUT=${1:-$(mktemp -d)}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
CONFIG=$(python -c 'from vlrl.distributed import accelerate_config; print(accelerate_config("ddp"))')
steps() {
  python - "$1" <<'PY'
import json, sys
steps = [json.loads(line)["step_time"] for line in open(f"{sys.argv[1]}/train_log.jsonl") if '"step_time"' in line]
print(f"  GSPO steps: {len(steps)}, mean step_time {sum(steps) / len(steps):.2f} s")
PY
}
echo "1 process:"
/usr/bin/time -f "  wall %e s  user %U s  sys %S s" python -m vlrl run --preset tiny --run-dir "$OUT/one" 2>&1 \
  | grep -E "^  wall|done in"
steps "$OUT/one"
echo "2 processes:"
/usr/bin/time -f "  wall %e s  user %U s  sys %S s" python -m accelerate.commands.launch --config_file "$CONFIG" \
  --num_processes 2 -m vlrl run --preset tiny --run-dir "$OUT/two" 2>&1 | grep -E "^  wall|done in"
steps "$OUT/two"
