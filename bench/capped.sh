#!/usr/bin/env bash
# The GPU presets under a hard cap of 23 GiB (issue 50 point 5), on ONE H200, carry [".whl", ".rehearsal"]:
#   bash bench/capped.sh start 580     wheels, data, checkpoints, then six lanes; waits <= 580 s and packs $OUT
#   bash bench/capped.sh wait 580      waits up to 580 s more (call again within the machine's idle release)
# Each preset runs through `vlrl run` as a user starts it (bench/rehearsal.sh's `rehearse`: random weights of the real
# config, rehearsal data, the reward random completions earn) with `--set model.memory_cap_gib=23`: the baseline eval,
# ONE batch at the preset's eval batch size, then two GSPO steps at the preset's shape (the eval after training left
# out: VLRL_SKIP_EVALS=after). The Crafter presets' steps each play one generation batch of episodes (the accumulation
# cut to it): every turn, batch and micro-batch at the preset's size, fewer of them. Then the 8B preset path with
# 2 pictures and with a 16-frame clip an item at 1,024 tokens under a cap of 22 GiB (issue 48 point 5).
# The lanes share the one GPU, so each process's cap counts its own CUDA context (measured alone before the lanes start,
# VLRL_CAP_CONTEXT_GIB) rather than the other lanes' memory; their step times are not speeds (six processes share the
# GPU). Results: /tmp/results/NAME.tar.gz per run (stages.json: each stage's allocator peaks and the process id;
# run.log: an out-of-memory error is one line there), apps.csv (nvidia-smi's memory per process every second). Each
# run unpacked joins bench/results/capped_runs.json (`python bench/results_io.py pack NAME ... --key NAME`, as the
# nvidia_smi and inputs8b keys there), then `python bench/capped_results.py` writes capped.md and engine.json's
# `capped_23gib`.
set -uo pipefail
export JOB_TIMEOUT=${JOB_TIMEOUT:-1700} CAP=${CAP:-23} VIRL_ROWS=${VIRL_ROWS:-4000}  # before rehearsal.sh's defaults
source bench/rehearsal.sh
CKPT=/tmp/ckpt LANES="0 1 2 3 4 5" LANE=lane
[ "${PLAN:-}" = rest ] && { LANES="0 1 2 3 4"; LANE=rest; }

ready() { until [ -e "$1" ]; do sleep 5; done; }

data() {  # ViRL39K's layout (VIRL_ROWS rows) and 8 / 16 / 32 of testmini's real annotations, one eval batch each
  # (the annotations: ../shared/data's, carried in .rehearsal/mathvista_testmini_annotations.jsonl.gz)
  python3 bench/rehearsal_data.py virl39k /tmp/data/virl --items "$VIRL_ROWS" --workers 8 > /tmp/results/data.log 2>&1
  for n in 8 16 32; do python3 bench/rehearsal_data.py mathvista /tmp/data/mv$n --items $n --workers 4 >> /tmp/results/data.log 2>&1; done
  touch /tmp/data/.ready
}

capped() {  # capped NAME PRESET CHECKPOINT EVAL_ITEMS [ARGS]: a MathVista preset, one eval batch, 2 steps, the cap
  local name=$1 preset=$2 ckpt=$3 items=$4; shift 4
  ready /tmp/data/.ready
  VLRL_SKIP_EVALS=after rehearse "$name" "$preset" --set model.name_or_path="$ckpt" --set data.source=/tmp/data/virl \
    --set eval.source=/tmp/data/mv$items --set training.max_steps=2 --set model.memory_cap_gib=$CAP "$@"
}

capped_episodes() {  # capped_episodes NAME PRESET CHECKPOINT BATCH: a Crafter preset, one eval batch, 2 steps of BATCH
  local name=$1 preset=$2 ckpt=$3 batch=$4
  VLRL_SKIP_EVALS=after rehearse "$name" "$preset" --set model.name_or_path="$ckpt" --set training.max_steps=2 \
    --set env.eval_seeds="$batch" --set training.gradient_accumulation_steps=$(( batch / 4 )) \
    --set model.memory_cap_gib=$CAP
}

lane0() {  # the 8B preset (its checkpoints: the 8B's, pre-quantized to 4-bit, and the Thinking one)
  data & checkpoints 8b; wait
  capped cap-8b qwen3-vl-8b-mathvista $CKPT/qwen3-vl-8b-random-bnb4 32
}

lane1() {  # the 8B Thinking preset
  ready $CKPT/qwen3-vl-8b-thinking-random-bnb4/tokenizer_config.json; sleep 10
  capped cap-8b-thinking qwen3-vl-8b-thinking-mathvista $CKPT/qwen3-vl-8b-thinking-random-bnb4 32
}

lane2() {  # the 4B preset
  checkpoints 4b
  capped cap-4b qwen3-vl-4b-mathvista $CKPT/qwen3-vl-4b-random 32
}

lane3() {  # Qwen3.5 9B, once the 8B's 16-bit checkpoint has left the disk
  ready $CKPT/qwen3-vl-8b-random-bnb4/config.json; until [ ! -d $CKPT/qwen3-vl-8b-random ]; do sleep 5; done
  checkpoints qwen3.5-9b
  capped cap-q35-9b qwen3.5-9b-mathvista $CKPT/qwen3.5-9b-random 16
}

lane4() {  # the 8B preset path with 2 pictures and with a 16-frame clip an item, 1,024 tokens, under 22 GiB
  ready $CKPT/qwen3-vl-8b-thinking-random-bnb4/tokenizer_config.json; sleep 10
  local start=$(date +%s)
  timeout 1500 python3 bench/gpu_engine.py --size 8b --checkpoint $CKPT/qwen3-vl-8b-random-bnb4 --completion 1024 \
    --paths vlrl-int8 --inputs 16-frames 2-images --steps 1 --memory-cap-gib 22 --out /tmp/results/inputs8b \
    > /tmp/results/inputs8b.log 2>&1
  echo "== inputs8b rc=$? $(( $(date +%s) - start ))s"; grep "^RESULT\|^FAILED" /tmp/results/inputs8b.log
}

lane5() {  # the 8B Crafter preset
  ready $CKPT/qwen3-vl-8b-thinking-random-bnb4/tokenizer_config.json; sleep 10
  capped_episodes cap-8b-crafter qwen3-vl-8b-crafter $CKPT/qwen3-vl-8b-random-bnb4 4
}

# PLAN=rest: what the first plan (2026-11-29, bench/results/capped.md) left, on a fresh machine:
#   PLAN=rest bash bench/capped.sh start 560    then: PLAN=rest bash bench/capped.sh wait 580
rest0() {  # the 8B Thinking preset at its eval batch of 16 (32 ran out of memory under the cap)
  data & checkpoints 8b; wait
  capped cap-8b-thinking-eval16 qwen3-vl-8b-thinking-mathvista $CKPT/qwen3-vl-8b-thinking-random-bnb4 16
}

rest1() { lane3; }  # Qwen3.5 9B, as the first plan's lane 3 would have run it

rest2() {  # the testmini-seed preset: it trains on testmini itself, 24 of the 32 items, 8 held out (one eval batch)
  ready $CKPT/qwen3-vl-8b-thinking-random-bnb4/tokenizer_config.json; ready /tmp/data/.ready; sleep 10
  VLRL_SKIP_EVALS=after rehearse cap-8b-seed qwen3-vl-8b-mathvista-testmini-seed \
    --set model.name_or_path=$CKPT/qwen3-vl-8b-random-bnb4 --set data.source=/tmp/data/mv32 --set data.hold_out=8 \
    --set training.max_steps=2 --set model.memory_cap_gib=$CAP
}

rest3() {  # the 2B MathVista preset
  checkpoints 2b
  capped cap-2b qwen3-vl-2b-mathvista $CKPT/qwen3-vl-2b-random 8
}

rest4() {  # Qwen3.5's 2B and 4B MathVista presets
  checkpoints qwen3.5-2b
  capped cap-q35-2b qwen3.5-2b-mathvista $CKPT/qwen3.5-2b-random 8
  checkpoints qwen3.5-4b
  capped cap-q35-4b qwen3.5-4b-mathvista $CKPT/qwen3.5-4b-random 8
}

report() {
  for n in $LANES; do
    echo "-- lane $n: $(cat /tmp/lanes/lane$n.done 2>/dev/null || echo running)"
    grep "^== \|^RESULT\|^FAILED\|rror" /tmp/lanes/lane$n.log 2>/dev/null | cut -c1-240 | tail -6
  done
  for log in /tmp/runs/cap-*.log; do
    [ -f "$log" ] && echo "$(basename "$log"): $(grep "^step \|^===\|rror\|memory cap" "$log" | tail -1 | cut -c1-160)"
  done
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader; df -h /tmp | tail -1
}

pack() {  # finished runs, and what unfinished ones have so far
  cp /tmp/lanes/*.log /tmp/results/ 2>/dev/null
  (cd /tmp/results && tar -czf "$OUT/capped.tar.gz" --exclude="*.safetensors" cap-*.tar.gz lane*.log apps.csv context_gib \
     data.log inputs8b.log inputs8b/*.json 2>/dev/null
   tar -czf "$OUT/capped_partial.tar.gz" /tmp/runs/cap-*.log /tmp/runs/cap-*.stages.json /tmp/runs/cap-*/train_log.jsonl \
     2>/dev/null)
  ls -la "$OUT"
}

wait_lanes() {  # wait_lanes SECONDS
  local until=$(( $(date +%s) + $1 ))
  while [ "$(date +%s)" -lt "$until" ] && [ "$(ls /tmp/lanes/*.done 2>/dev/null | wc -l)" -lt "$(echo $LANES | wc -w)" ]; do sleep 10; done
  report; pack
}

case "${1:-}" in
  start)
    if pgrep -f "[s]ource bench/capped.sh; " > /dev/null; then  # a second start would measure the first's processes
      echo "lanes are running already (a held machine keeps them between calls): bash bench/capped.sh wait SECONDS"
      wait_lanes "${2:-580}"; exit 0
    fi
    rm -rf /tmp/lanes; mkdir -p /tmp/lanes /tmp/results /tmp/data
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    python3 -c "import torch; torch.zeros(1, device='cuda'); free, total = torch.cuda.mem_get_info(); \
print(round((total - free - torch.cuda.memory_reserved()) / 2**30, 3))" > /tmp/results/context_gib
    echo "one process's CUDA context alone: $(cat /tmp/results/context_gib) GiB"
    export VLRL_CAP_CONTEXT_GIB=$(cat /tmp/results/context_gib)
    setsid nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -l 1 \
      >> /tmp/results/apps.csv 2>&1 < /dev/null &  # setsid: it samples past the end of this call, as the lanes run
    for n in $LANES; do
      setsid bash -c "source bench/capped.sh; $LANE$n; echo \"done \$(date +%T)\" > /tmp/lanes/lane$n.done" \
        > /tmp/lanes/lane$n.log 2>&1 < /dev/null &
    done
    sleep 2; wait_lanes "${2:-580}" ;;
  wait) wait_lanes "${2:-580}" ;;
esac
