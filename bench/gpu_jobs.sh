#!/usr/bin/env bash
# Runs GPU jobs on the device machine; each job's log and results are packed into $OUT (8 files come back at most).
#   bash bench/gpu_jobs.sh tiny-gpu learn:bench/learning/greedy-vision.toml "8b bnb4 256" "8b bnb4 1024 fast micro4" ...
#   (carry [".whl"])
# tiny-gpu: `vlrl train --preset tiny-gpu` (the Unsloth backend), started in the background;
# learn:CONFIG: `vlrl run --config CONFIG`, then a sampled eval of the warm start and of the adapter, compared; all
#   learn jobs run side by side (small models leave the GPU mostly idle), each packed into learn_NAME.tar.gz;
# "SIZE BACKEND COMPLETION [fast] [microN] [thinkN]": one bench/gpu_gspo.py process, one after another, after the
#   learn jobs (thinkN: a thinking prompt under [training] thinking_budget = N).
set -uo pipefail
source bench/device_setup.sh

clean_log() {  # progress bars and per-step dicts out: what is left fits in output_tail
  tr '\r' '\n' < "$1" | grep -v "it/s\]\|s/it\]\|item/s\]\|step/s\]\|s/step\]\|examples/s\]\|^\s*$\|^{'loss\|Warning\|warn(" | tail -${2:-8}
}

learn() {  # learn CONFIG: one learning run, its sampled evals and comparison, packed
  local config=$1 name dir start=$(date +%s)
  name=$(basename "$config" .toml); dir=/tmp/learn/$name
  rm -rf "$dir"  # a fresh run directory: never reuse records of an earlier run
  # Side-by-side runs share 16 cores: 16 OpenMP threads each spun 50x slower (2.5 s per warm-start step).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
  timeout ${LEARN_TIMEOUT:-480} python3 -m vlrl run --config "$config" --run-dir "$dir" > /tmp/results/$name.log 2>&1
  local rc=$?
  # the same held-out items, one draw each at temperature 1, seed 0 (a run file with [eval] samples has them already);
  # a step that fails is named and makes the job's rc nonzero, instead of leaving its files silently missing
  if [ -f "$dir/adapter/adapter_config.json" ] && ! grep -q "^samples = [1-9]" "$config"; then
    python3 -m vlrl eval --run-dir "$dir" --samples 1 --temperature 1 --seed 0 \
        --output "$dir/eval_base_sampled.jsonl" >> /tmp/results/$name.log 2>&1 &&
      python3 -m vlrl eval --run-dir "$dir" --samples 1 --temperature 1 --seed 0 --adapter "$dir/adapter" \
        --output "$dir/eval_adapter_sampled.jsonl" >> /tmp/results/$name.log 2>&1 &&
      python3 -m vlrl compare "$dir/eval_base_sampled.jsonl" "$dir/eval_adapter_sampled.jsonl" \
        --output "$dir/comparison_sampled.json" >> /tmp/results/$name.log 2>&1
    local sampled_rc=$?
    if [ $sampled_rc -ne 0 ]; then
      echo "== $name: a sampled eval or its comparison failed (rc=$sampled_rc), see its run.log" \
        | tee -a /tmp/results/$name.log
      [ $rc -eq 0 ] && rc=$sampled_rc
    fi
  fi
  cp /tmp/results/$name.log "$dir/run.log"
  tar -czf $OUT/learn_$name.tar.gz -C /tmp/learn --exclude="$name/checkpoints" --exclude="$name/adapter" "$name"
  echo "== $name rc=$rc $(( $(date +%s) - start ))s"; clean_log /tmp/results/$name.log 6
}

pids=()
for job in "$@"; do
  case "$job" in
    tiny-gpu)
      ( python3 -c "from vlrl.training.warmstart import ensure_tiny; ensure_tiny(warm_start_steps=150, image_size=64)" > /dev/null 2>&1
        timeout ${JOB_TIMEOUT:-300} python3 -m vlrl train --preset tiny-gpu --run-dir /tmp/tiny-gpu > /tmp/results/tiny-gpu.log 2>&1
        echo "== tiny-gpu rc=$?"; clean_log /tmp/results/tiny-gpu.log 4
        cp /tmp/tiny-gpu/train_log.jsonl /tmp/results/tiny-gpu_train_log.jsonl 2>/dev/null
        cp /tmp/tiny-gpu/grpo_config.json /tmp/results/tiny-gpu_grpo_config.json 2>/dev/null ) &
      pids+=($!) ;;
    learn:*) learn "${job#learn:}" & pids+=($!) ;;
  esac
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"

for job in "$@"; do
  case "$job" in tiny-gpu|learn:*) continue ;; esac
  set -- $job
  start=$(date +%s) micro=8 fast="" think=0
  for flag in "${@:4}"; do
    case "$flag" in fast) fast=--fast-generation ;; micro*) micro=${flag#micro} ;; think*) think=${flag#think} ;; esac
  done
  name=$(echo "$job" | tr ' ' '_')
  timeout ${JOB_TIMEOUT:-300} python3 bench/gpu_gspo.py --size $1 --backend $2 --completion $3 --steps ${STEPS:-3} \
    $fast --micro-batch $micro --thinking-budget $think --out /tmp/results > /tmp/results/$name.log 2>&1
  echo "== $name rc=$? $(( $(date +%s) - start ))s"; grep RESULT /tmp/results/$name.log || clean_log /tmp/results/$name.log 5
  tar -czf $OUT/bench.tar.gz -C /tmp --exclude="results/run*" results  # after each job: a call cut off keeps the rest
done
tar -czf $OUT/bench.tar.gz -C /tmp --exclude="results/run*" results
nvidia-smi --query-gpu=name,memory.used --format=csv
