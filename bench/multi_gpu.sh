#!/usr/bin/env bash
# The multi-GPU runs (issue 21), on the device machine's nvidia-h200-x2 kind, with the wheel set (carry [".whl", ".rehearsal"]):
#   bash bench/multi_gpu.sh ddp     # the 2B preset: `vlrl train` on 1 GPU, then DDP on 2 GPUs, same global step
#   bash bench/multi_gpu.sh fsdp    # the 8B shape in bf16, FSDP 2 over 2 GPUs: a few GSPO steps, a verified adapter
# Each job is `vlrl train` as a user starts it, with only the model (random weights, real shape, saved like the hub
# checkpoint), the data (real layouts, pictures at real sizes: bench/rehearsal_data.py) and max_steps changed, through
# bench/rehearsal_cli.py: the CLI plus a reward random completions earn, so the steps train (random weights score 0).
# Per-GPU memory: nvidia-smi sampled every 0.5 s during each job (peak used, the CUDA context included). Results:
# $OUT/<job>.tar.gz (train_log.jsonl, grpo_config.json, the log, the memory samples; no weights: a file must stay
# under 16 MiB), and each step's time, completion length and reward printed after its job, which
# bench/results/multi_gpu.md was written from. NVLink multicast stays off: NCCL_NVLS_ENABLE and the others are left
# as the machine sets them.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD VLRL_CACHE=/tmp/vlrl-cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-unset}"
python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))"

prepare() {  # the data and the random-weight checkpoints, once per machine
  [ -f /tmp/data/mv/testmini.jsonl ] || python3 bench/rehearsal_data.py mathvista /tmp/data/mv --workers 16
  [ -f /tmp/data/virl/39Krelease.parquet ] || python3 bench/rehearsal_data.py virl39k /tmp/data/virl --items ${ITEMS:-1000} --workers 16
  for size in "$@"; do
    python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from gpu_gspo import build_checkpoint; \
print(build_checkpoint('$size', Path('/tmp/ckpt')))"
  done
}

job() {  # job NAME PROCESSES ACCELERATE_CONFIG ARGS...: one `vlrl train`, its memory sampled, packed into $OUT
  local name=$1 procs=$2 conf=$3; shift 3
  local dir=/tmp/runs/$name start=$(date +%s)
  rm -rf "$dir"; mkdir -p /tmp/runs
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > /tmp/runs/$name.mem &
  local smi=$!
  if [ "$procs" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout ${JOB_TIMEOUT:-330} python3 bench/rehearsal_cli.py train "$@" --run-dir "$dir" \
      > /tmp/runs/$name.log 2>&1
  else
    timeout ${JOB_TIMEOUT:-330} python3 -m accelerate.commands.launch --config_file vlrl/accelerate_configs/$conf.yaml \
      --num_processes $procs bench/rehearsal_cli.py train "$@" --run-dir "$dir" > /tmp/runs/$name.log 2>&1
  fi
  local rc=$?
  kill $smi
  echo "== $name rc=$rc $(( $(date +%s) - start ))s"
  tr '\r' '\n' < /tmp/runs/$name.log | grep -v "it/s\]\|s/it\]\|^\s*$\|^{'loss\|Warning\|warn(" | tail -${TAIL:-6}
  grep -h "^vlrl \|Error\|adapter:" /tmp/runs/$name.log | grep -v Warning | tail -4
  python3 -c "import json, sys; [print({k: r.get(k) for k in ('step', 'step_time', 'completions/mean_length', 'reward')})
    for r in map(json.loads, open(sys.argv[1]))]" "$dir/train_log.jsonl" 2>/dev/null
  sort -t, -k1,1n -k2,2n /tmp/runs/$name.mem | awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {for (g in m) print "gpu", g, "peak MiB", m[g]}'
  cp /tmp/runs/$name.log /tmp/runs/$name.mem "$dir"/ 2>/dev/null
  tar -czf $OUT/$name.tar.gz -C /tmp/runs --exclude="$name/checkpoints" --exclude=tokenizer.json --exclude="*.safetensors" "$name"
}

MODEL2B=(--set model.name_or_path=/tmp/ckpt/qwen3-vl-2b-random --set data.source=/tmp/data/virl
         --set eval.source=/tmp/data/mv --set training.save_steps=1000)
case "${1:-ddp}" in
  ddp)
    prepare 2b
    # the preset's optimizer step: 32 completions = 8 prompts x 4; each GPU decodes 8 at a time (per process)
    job ddp1 1 - --preset qwen3-vl-2b-mathvista "${MODEL2B[@]}" --set training.max_steps=${STEPS:-3}
    job ddp2 2 ddp --preset qwen3-vl-2b-mathvista "${MODEL2B[@]}" --set training.max_steps=${STEPS:-3} \
      --set training.gradient_accumulation_steps=4 ;;
  fsdp)
    prepare 8b
    # bf16 weights sharded; TRL gathers them for each rollout, so eager decoding (fast_generation off) and short
    # completions keep the few steps inside the call
    job fsdp8b 2 fsdp --preset qwen3-vl-8b-mathvista --set model.name_or_path=/tmp/ckpt/qwen3-vl-8b-random \
      --set model.load_in_4bit=false --set data.source=/tmp/data/virl --set eval.source=/tmp/data/mv \
      --set training.fast_generation=false --set training.max_completion_length=${COMPLETION:-128} \
      --set training.per_device_train_batch_size=4 --set training.gradient_accumulation_steps=2 \
      --set training.generation_batch_size=4 --set training.max_steps=${STEPS:-3} --set training.save_steps=1000 ;;
esac
nvidia-smi --query-gpu=index,name,memory.used --format=csv
