#!/usr/bin/env bash
# Runs GPU jobs on the device machine; each job's log and results are packed into $OUT (8 files come back at most).
#   bash bench/gpu_jobs.sh tiny-gpu learning "8b bnb4 256" "8b bnb4 256 fast" ...      (carry [".whl"])
# tiny-gpu: `vlrl train --preset tiny-gpu` (the Unsloth backend); learning: `vlrl run --config bench/gpu_learning.toml`
# (LEARN_CONFIG overrides); "SIZE BACKEND COMPLETION [fast]": one bench/gpu_gspo.py process.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD VLRL_CACHE=/tmp/vlrl-cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/results
for job in "$@"; do
  start=$(date +%s)
  if [ "$job" = tiny-gpu ]; then
    python3 -c "from vlrl.tiny import ensure_tiny; ensure_tiny(warm_start_steps=150, image_size=64)" > /dev/null 2>&1
    timeout ${JOB_TIMEOUT:-300} python3 -m vlrl train --preset tiny-gpu --output-dir /tmp/tiny-gpu > /tmp/results/tiny-gpu.log 2>&1
    echo "tiny-gpu rc=$? $(( $(date +%s) - start ))s"
    cp /tmp/tiny-gpu/train_log.jsonl /tmp/results/tiny-gpu_train_log.jsonl 2>/dev/null
    cp /tmp/tiny-gpu/grpo_config.json /tmp/results/tiny-gpu_grpo_config.json 2>/dev/null
  elif [ "$job" = learning ]; then
    rm -rf /tmp/learning  # a fresh run directory: never reuse records of an earlier run
    timeout ${LEARN_TIMEOUT:-420} python3 -m vlrl run --config ${LEARN_CONFIG:-bench/gpu_learning.toml} --output-dir /tmp/learning > /tmp/results/learning.log 2>&1
    echo "learning rc=$? $(( $(date +%s) - start ))s"
    tar -czf $OUT/learning.tar.gz -C /tmp learning/config.toml learning/data_report.json learning/eval_before.jsonl \
      learning/eval_after.jsonl learning/comparison.json learning/train_log.jsonl 2>/dev/null
    tr '\r' '\n' < /tmp/results/learning.log | grep -v "it/s\]\|s/it\]\|item/s\]\|step/s\]\|s/step\]\|^\s*$" | grep -v "^{'loss" | tail -12
  else
    set -- $job
    name="$1_$2_$3${4:+_$4}"
    timeout ${JOB_TIMEOUT:-300} python3 bench/gpu_gspo.py --size $1 --backend $2 --completion $3 --steps ${STEPS:-3} \
      ${4:+--fast-generation} --out /tmp/results > /tmp/results/$name.log 2>&1
    echo "$name rc=$? $(( $(date +%s) - start ))s"; grep RESULT /tmp/results/$name.log || tail -5 /tmp/results/$name.log
  fi
done
tar -czf $OUT/bench.tar.gz -C /tmp --exclude=results/run results
nvidia-smi --query-gpu=name,memory.used --format=csv
