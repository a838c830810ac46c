#!/usr/bin/env bash
# Issue 36: the qwen3.5-2b-crafter preset's memory, on the device machine (carry [".whl"]): one GSPO step of one
# generation batch (8 episodes x 16 turns, every reply up to its 256 tokens) through `vlrl run` with its evals left
# out (bench/rehearsal_cli.py, VLRL_SKIP_EVALS=1), on a random-weight Qwen3.5-2B of the real config. Everything is
# written under $OUT as it happens (the GPU's memory every 0.5 s, the run's log, its stages' peaks), so a call cut
# short still returns what it measured.
#   bash bench/qwen35_crafter_step.sh
set -uo pipefail
source bench/device_setup.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
started=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from gpu_gspo import build_checkpoint; \
print(build_checkpoint('qwen3.5-2b', Path('/tmp/ckpt')))" 2>&1 | tail -1
echo "checkpoint ready at $(( $(date +%s) - started )) s"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu_memory_mib.csv" &
smi=$!
VLRL_SKIP_EVALS=1 VLRL_STAGES="$OUT/stages.json" python3 bench/rehearsal_cli.py run --preset qwen3.5-2b-crafter \
  --run-dir /tmp/q35-crafter --set model.name_or_path=/tmp/ckpt/qwen3.5-2b-random --set training.max_steps=1 \
  --set env.eval_seeds=8 --set training.gradient_accumulation_steps=2 2>&1 \
  | grep --line-buffered -v "it/s]\|s/it]" > "$OUT/run.log"
echo "rc ${PIPESTATUS[0]} at $(( $(date +%s) - started )) s"
kill $smi
cp /tmp/q35-crafter/train_log.jsonl "$OUT/" 2>/dev/null
echo "nvidia-smi peak $(sort -n "$OUT/gpu_memory_mib.csv" | tail -1) MiB"
tail -5 "$OUT/run.log"
