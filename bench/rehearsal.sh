#!/usr/bin/env bash
# GPU rehearsals of the presets (issue 19), on the device machine, carry [".whl", ".rehearsal"]:
#   bash bench/rehearsal.sh prepare 2b 4b 8b          the data and the random-weight checkpoints, once per machine
#   bash bench/rehearsal.sh checkpoints 8b            the checkpoints alone (the decode table needs no data)
#   bash bench/rehearsal.sh run NAME PRESET [ARGS]    `vlrl run --preset PRESET` as a user starts it -> NAME.tar.gz
#   bash bench/rehearsal.sh mathvista NAME PRESET CHECKPOINT [ARGS]   run, on the rehearsal data, 2 training steps
#   bash bench/rehearsal.sh decode SIZE CHECKPOINT    the decode table (bench/gpu_engine_decode.py) -> decode_SIZE.tar.gz
# Results go to /tmp/results (kept across calls while the machine is held) and, when $OUT is set, to $OUT too;
# a run's NAME.tar.gz, unpacked here, is kept as one key of bench/results/rehearsal_runs.json:
#   tar -xzf NAME.tar.gz && python bench/results_io.py pack NAME bench/results/rehearsal_runs.json --key NAME
# bench/rehearse_all.sh runs every preset at once, one GPU each, across several calls.
# What a rehearsal changes and nothing else: the model (random weights of the real shape and config, saved like the
# hub checkpoint; the 8B pre-quantized to bitsandbytes 4-bit as Unsloth's is, vision tower and lm_head in 16 bits),
# the data (bench/rehearsal_data.py: ViRL39K's layout, 4,000 rows, pictures at MathVista's real sizes; as the eval
# source 8 of testmini's real annotations, spread evenly), training.max_steps, and the reward random completions earn
# (bench/rehearsal_cli.py). Each stage of the run is timed with its peak CUDA memory (VLRL_STAGES), nvidia-smi is
# sampled every 0.5 s, and each step's time and rollout/training mismatch come from train_log.jsonl.
set -uo pipefail
source bench/device_setup.sh

EVAL_ITEMS=${EVAL_ITEMS:-32}     # testmini items each rehearsal evaluates: 4 batches of 8, or one of 32 (the 8B)
VIRL_ROWS=${VIRL_ROWS:-38870}    # ViRL39K's rows at the release's size: the data stage reads all of them
prepare() {
  [ -f /tmp/data/mv$EVAL_ITEMS/testmini.jsonl ] || \
    python3 bench/rehearsal_data.py mathvista /tmp/data/mv$EVAL_ITEMS --items $EVAL_ITEMS --workers "$(nproc)"
  [ -f /tmp/data/virl/39Krelease.parquet ] || \
    python3 bench/rehearsal_data.py virl39k /tmp/data/virl --items $VIRL_ROWS --workers "$(nproc)"
  checkpoints "$@"
}

checkpoints() {
  for size in "$@"; do  # the 8B's 16-bit weights are built only to be pre-quantized, and removed then
    [ "$size" = 8b ] && [ -f /tmp/ckpt/qwen3-vl-8b-random-bnb4/config.json ] && continue
    python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from gpu_gspo import build_checkpoint; \
print(build_checkpoint('$size', Path('/tmp/ckpt')))" 2>&1 | tail -1
  done
  [[ " $* " == *" 8b "* ]] || { df -h /tmp | tail -1; return; }  # other sizes may be building beside this one
  if [ -d /tmp/ckpt/qwen3-vl-8b-random ] && [ ! -f /tmp/ckpt/qwen3-vl-8b-random-bnb4/config.json ]; then
    python3 - <<'PY' 2>&1 | grep -v Warning | tail -2
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText

from vlrl.model.loading import bnb_4bit_config

src, dst = Path("/tmp/ckpt/qwen3-vl-8b-random"), Path("/tmp/ckpt/qwen3-vl-8b-random-bnb4")
model = AutoModelForImageTextToText.from_pretrained(
    src, dtype=torch.bfloat16, device_map={"": 0},
    quantization_config=bnb_4bit_config(skip_modules=["visual", "lm_head"]))  # as Unsloth's dynamic 4-bit keeps them
model.save_pretrained(dst)
for f in src.iterdir():  # the processor's files
    if f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
        shutil.copy(f, dst / f.name)
print("pre-quantized:", dst, sum(f.stat().st_size for f in dst.iterdir()) / 1e9, "GB")
PY
    rm -rf /tmp/ckpt/qwen3-vl-8b-random  # 17 GB of disk back
  fi
  if [ -d /tmp/ckpt/qwen3-vl-8b-random-bnb4 ] && [ ! -f /tmp/ckpt/qwen3-vl-8b-thinking-random-bnb4/config.json ]; then
    # the Thinking checkpoint: the same weights, the processor with a Qwen3-VL-Thinking chat template (opens <think>)
    mkdir -p /tmp/ckpt/qwen3-vl-8b-thinking-random-bnb4
    ln -sf /tmp/ckpt/qwen3-vl-8b-random-bnb4/{*.safetensors*,config.json,generation_config.json} \
      /tmp/ckpt/qwen3-vl-8b-thinking-random-bnb4/
    python3 -c "from vlrl.model import prompts, tiny; tiny.build_processor(max_pixels=16384 * 28 * 28, \
chat_template=prompts.THINKING_CHAT_TEMPLATE).save_pretrained('/tmp/ckpt/qwen3-vl-8b-thinking-random-bnb4')"
  fi
  df -h /tmp | tail -1
}

summarize() {  # summarize NAME DIR: stages, steps, memory
  local name=$1 dir=$2
  python3 - "$name" "$dir" <<'PY'
import json, sys
from pathlib import Path
name, run = sys.argv[1], Path(sys.argv[2])
stages = Path(f"/tmp/runs/{name}.stages.json")
if stages.exists():
    for s in json.loads(stages.read_text())["stages"]:
        print(f"  {s['seconds']:8.1f} s  alloc {s.get('peak_allocated_gib')} reserved {s.get('peak_reserved_gib')} GiB  {s['stage']}")
keys = ("step", "step_time", "rollout_time", "completions/mean_length", "reward", "sampling/rollout_train_kl",
        "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
        "sampling/train_rollout_ratio/max", "sampling/train_rollout_ratio/above_cap")
log = run / "train_log.jsonl"
for line in (log.read_text().splitlines() if log.exists() else []):
    r = json.loads(line)
    if "step_time" in r or "sampling/rollout_train_kl" in r:
        print("  step", {k.split("/")[-1] if "/" in k else k: (round(r[k], 6) if isinstance(r.get(k), float) else r.get(k)) for k in keys if k in r})
PY
}

rehearse() {  # rehearse NAME PRESET ARGS...
  local name=$1 preset=$2; shift 2
  local dir=/tmp/runs/$name start=$(date +%s)
  rm -rf "$dir"; mkdir -p /tmp/runs
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${LANE_GPU:-0}" -lms 500 > /tmp/runs/$name.mem &
  local smi=$!
  VLRL_STAGES=/tmp/runs/$name.stages.json timeout ${JOB_TIMEOUT:-540} python3 bench/rehearsal_cli.py run \
    --preset "$preset" --run-dir "$dir" "$@" > /tmp/runs/$name.log 2>&1
  local rc=$?
  kill $smi
  echo "== $name rc=$rc $(( $(date +%s) - start ))s; nvidia-smi peak $(sort -n /tmp/runs/$name.mem | tail -1) MiB"
  tr '\r' '\n' < /tmp/runs/$name.log | grep -v "it/s\]\|s/it\]\|^\s*$\|^{'loss\|Warning\|warn(" | grep -i "error\|eval:\|data:\|adapter\|gguf\|merged\|done in\|Traceback" | tail -${TAIL:-12}
  summarize "$name" "$dir"
  cp /tmp/runs/$name.log "$dir"/run.log  # the names rehearsal_runs.json keeps
  cp /tmp/runs/$name.mem "$dir"/nvidia_smi_mib.txt; cp /tmp/runs/$name.stages.json "$dir"/stages.json 2>/dev/null
  tar -czf /tmp/results/$name.tar.gz -C /tmp/runs --exclude="$name/checkpoints" --exclude="$name/eval_images" \
    --exclude="$name/episode_frames" --exclude="*.safetensors" --exclude="*.gguf" --exclude=tokenizer.json "$name"
  [ -n "${OUT:-}" ] && cp /tmp/results/$name.tar.gz "$OUT"/
}

mathvista() {  # mathvista NAME PRESET CHECKPOINT [ARGS]: a MathVista preset on the prepared data, STEPS (2) steps
  local name=$1 preset=$2 ckpt=$3; shift 3
  rehearse "$name" "$preset" --set model.name_or_path="$ckpt" --set data.source=/tmp/data/virl \
    --set eval.source=/tmp/data/mv$EVAL_ITEMS --set training.max_steps="${STEPS:-2}" "$@"
}

decode() {  # decode SIZE CHECKPOINT [ARGS]
  local size=$1 ckpt=$2; shift 2
  local start=$(date +%s)
  timeout ${JOB_TIMEOUT:-540} python3 bench/gpu_engine_decode.py --size "$size" --checkpoint "$ckpt" --out /tmp/decode "$@" \
    > /tmp/decode_$size.log 2>&1
  echo "== decode $size rc=$? $(( $(date +%s) - start ))s"
  grep "^T+\|^DECODE\|^AGREEMENT\|^PACKED\|Error\|[Rr]ecompil\|[Gg]raph break" /tmp/decode_$size.log | cut -c1-400 | tail -${TAIL:-30}
  mkdir -p /tmp/decode; cp /tmp/decode_$size.log /tmp/decode/
  tar -czf /tmp/results/decode_$size.tar.gz -C /tmp decode
  [ -n "${OUT:-}" ] && cp /tmp/results/decode_$size.tar.gz "$OUT"/
}

[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0  # sourced for its functions (bench/rehearse_all.sh)
what=$1; shift
case "$what" in
  prepare) prepare "$@" ;;
  checkpoints) checkpoints "$@" ;;
  run) rehearse "$@" ;;
  mathvista) mathvista "$@" ;;
  decode) decode "$@" ;;
esac
