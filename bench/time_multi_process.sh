#!/usr/bin/env bash
# `vlrl run --preset tiny` in one process against two (accelerate launch, the shipped DDP config, gloo on CPU), warm
# tiny model already cached in $VLRL_CACHE: wall, user and sys seconds of the whole loop, and the GSPO step times
# from train_log.jsonl. Two processes run twice: with the preset's per-device batch (8, so each step takes 16
# completions, twice one process's) and with 4 per device (the one-process step's 8 completions, split). One thread
# per process (OMP_NUM_THREADS=1): two processes use both cores of a 2-core machine, one process one of them.
# Results in bench/results/multi_process.md.
#   bash bench/time_multi_process.sh [OUT_DIR]
set -euo pipefail
OUT=${1:-$(mktemp -d)}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
CONFIG=$(python -c 'from vlrl.base.distributed import accelerate_config; print(accelerate_config("ddp"))')
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
for per_device in 8 4; do
  echo "2 processes x per-device batch $per_device:"
  /usr/bin/time -f "  wall %e s  user %U s  sys %S s" python -m accelerate.commands.launch --config_file "$CONFIG" \
    --num_processes 2 -m vlrl run --preset tiny --set training.per_device_train_batch_size=$per_device \
    --run-dir "$OUT/two-$per_device" 2>&1 | grep -E "^  wall|done in"
  steps "$OUT/two-$per_device"
done
