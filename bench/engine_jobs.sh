#!/usr/bin/env bash
# The decoding engine's GPU measurements (issue 32), run on the device machine in the background so that they can
# outlive one call; results and logs go to /tmp/results/engine, which each call copies into its $OUT.
#   bash bench/engine_jobs.sh start PLAN SECONDS   # starts PLAN's jobs, waits up to SECONDS, copies what is there
#   bash bench/engine_jobs.sh wait SECONDS          # a later call (within the machine's 30 s warm window)
# Carry [".whl"]. Plans:
#   first: the engine against transformers' generate on the tiny model (tokens and host syncs), the 8B decode table
#          (generate, engine) at 256 tokens, and GSPO steps at 256 tokens: plain TRL, vlrl on NF4
#   gspo: the tiny agreement again (host syncs), then GSPO steps at 256 tokens: plain TRL, vlrl on NF4 (16 at once),
#         and vlrl on each packed format of FORMATS at 32 at once
#   final: plain TRL at 1024 tokens (one step: eager, nothing to compile), then vlrl on the int8-packed base at 32
#          at once, at 1024 and 256 tokens
#   packed: the same for the packed formats FORMATS (default "int8"), at 256 and 1024 tokens
#   s39: Qwen3.5 2B (bf16) and 9B (int8-packed) against plain TRL at 256 tokens, the 9B at its preset's 1536 for
#        memory and the mismatch, then a profile of the 8B's int8 decoding step
#   grouped: the 8B int8 decoding step profiled, then GSPO steps against plain TRL at 256 and 1024 tokens
#   s40: plain TRL and vlrl (micro-batch 8) at 256 tokens, the decoding step profiled, the 8B preset's shape at 1024
#        (memory), vlrl at 256 and micro-batch 4, plain TRL at 1024: vlrl's processes with expandable segments
#   s40b: the Qwen3.5 9B preset's shape at micro-batch 2, the 8B preset's at micro-batch 8 (expandable segments)
#   s40c: the 2B Crafter preset's step through the core (two steps of 8 episodes, no evals), the Qwen3.5 9B
#         preset's shape at micro-batch 1
#   s40d: the Qwen3.5 9B preset's shape at micro-batch 1 decoding 16 at once
#   s41: after the shared-input fusion (vlrl.engine.fusion): the 8B int8 decoding step profiled layer by layer and
#        fused, then plain TRL and vlrl (micro-batch 4) at 256 tokens, the 8B preset's shape and plain TRL at 1024
#   s41b: the decode table (fastest of three calls each), the Qwen3.5 2B and 4B MathVista presets' shapes (1536 and 1024 tokens) for memory and the mismatch, then
#         the 2B Crafter preset's step through the core again
#   s41c: the Qwen3.5 2B preset's shape at micro-batch 2 and the 4B's at 1
#   s43: the 2B Crafter preset's step with its 16 episodes decoded at once (rollout_time logged), then the
#        qwen3.5-2b-crafter preset's step (memory; bench/qwen35_crafter_step.sh)
#   s44: the 8B Crafter preset's step through the core (two steps of 8 episodes, 4 at once; rollout_time logged)
#   s45: the decoding attention at long contexts (bench/gpu_decode_attention.py), then the 2B and 8B Crafter presets'
#        steps after the merged turn scoring
#   s46: the 2B Crafter step with the kept cache (vlrl.engine.session) and with every turn prefilled whole, the 8B
#        adapter's read-back gap, then the 8B Crafter step with the kept cache
#   s42: the 2B Crafter preset's step through the fused engine (8 episodes at once, then 16), then s41c
#   s50: issue 50 points 1-3, alone on the GPU: the update pass by rows (bench/gpu_update.py), then each MathVista
#        preset's shape (its batch, micro-batch and length) on plain TRL (one step: eager, nothing to compile; at 256
#        tokens after a warm-up step) and on vlrl's path (a compiling step, then one); packed into engine_runs.json
#        (`python bench/results_io.py pack DIR bench/results/engine_runs.json --key KEY`) and named in
#        engine_results.py's SIDE_BY_SIDE, `python bench/engine_results.py` writes engine.json's `presets` from them
#   s51: issue 50 (2026-12-07, one H100): the decoding attention timed from CUDA graphs, then the 8B at 256 tokens,
#        the 2B and 4B presets' shapes side by side with plain TRL (pass_tokens 6144 on vlrl's path); the thinking
#        preset's pair and the 8B at 1,024 did not run (the session's device time ran out)
#   s52: not run (see plan_s52); s52a: its first measurement alone
#   s53: after the chunked loss scoring: the 8B at 256 tokens (plain TRL, then vlrl at three pass sizes), at 1,024 (vlrl at
#        three pass sizes), then the update by rows, the 2B Crafter step (SDPA, FlexAttention), the thinking preset's pair
#   s54: the update pass by rows with the decoder layers compiled and not, then the 8B at 256 tokens (plain TRL, vlrl)
#   s55: after the compiled decoder layers, gemlite back: the 8B at 256 (TRL, vlrl at two pass sizes), the 2B Crafter
#        step, the 8B at 1,024, the 8B at 256 with eager layers
#   s56: s55 again with every layer compiled (all 36 ran so), the 8B at 1,024 beside plain TRL, the 2B Crafter step,
#        the eager-layers step (the thinking preset's pair: out of device time)
#   s57: s56's 8B rows with three measured steps a setting, eager first (s56's one step each left compiled against
#        eager inside the step-to-step noise), each row with the engine's own prefill and decoding-step times, then
#        the 2B Crafter step (its train log splits the rollout the same way); not run whole. s57b (run 2026-12-07,
#        one H100, key `s57`): the same less plain TRL at 1,024; only plain TRL and the eager rows at 256 ran before
#        the machine was lost. s57c: the 8B at 1,024 with eager layers, for its decoding-step share (not run)
#   s58: s57 less the Crafter step and the eager 24,576 rows, ordered for a session short of device time (run
#        2026-12-08, one H100, key `s58`: the 256-token rows; the 1,024-token ones ran out of device time). s59: those
#        1,024-token rows alone (vlrl compiled, then plain TRL's one step), about 600 s
#   qwen35: issue 36's rows, not yet run: the tiny Qwen3.5's engine/generate agreement, then at the Qwen3.5 2B (bf16)
#           and 9B (NF4, then int8-packed) shapes a decode table and GSPO steps at 1024 tokens side by side with plain
#           TRL, with peak memory and the rollout/training mismatch in each JSON
set -uo pipefail
source bench/device_setup.sh
RESULTS=/tmp/results/engine
mkdir -p $RESULTS

copy_out() {
  mkdir -p $OUT
  tar -czf $OUT/engine_results.tar.gz -C /tmp/results --exclude="run-*" engine 2>/dev/null
  for log in $RESULTS/*.log; do
    [ -f "$log" ] && tr '\r' '\n' < "$log" | grep -E "RESULT|PARTS|DECODE|AGREEMENT|FAILED|Error|error|T\+|PACKED|ATTENTION|RELOAD|^==|step " \
      | cut -c1-600 | tail -40
  done
}

plan_first() {
  tiny_agreement
  python3 bench/gpu_engine_decode.py --size 8b --paths generate engine --rows 16 32 --completion 256 \
    --out $RESULTS > $RESULTS/decode_first.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths trl vlrl --out $RESULTS > $RESULTS/gspo_first.log 2>&1
}

tiny_agreement() {
  TINY=$(python3 -c "from vlrl.training.warmstart import ensure_tiny; print(ensure_tiny(warm_start_steps=150, image_size=64))" \
    2>/dev/null | tail -1)
  python3 bench/gpu_engine_decode.py --tiny "$TINY" --paths --out $RESULTS > $RESULTS/agreement.log 2>&1
}

plan_gspo() {
  local paths=""
  for f in ${FORMATS:-}; do paths="$paths vlrl-$f"; done
  tiny_agreement
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths trl vlrl --out $RESULTS > $RESULTS/gspo_256.log 2>&1
  [ -n "$paths" ] && python3 bench/gpu_engine.py --size 8b --completion 256 --paths $paths --generation-batch 32 \
    --out $RESULTS > $RESULTS/gspo_packed_256.log 2>&1
}

plan_final() {  # the 8B preset's path (int8, 32 at once) against plain TRL at 1024 tokens, then at 256
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS \
    > $RESULTS/gspo_trl_1024.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --generation-batch 32 --out $RESULTS \
    > $RESULTS/gspo_int8_1024.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths vlrl-int8 --generation-batch 32 --out $RESULTS \
    > $RESULTS/gspo_int8_256.log 2>&1
}

plan_packed() {
  local formats=${FORMATS:-int8} paths="" decode_paths=""
  for f in $formats; do paths="$paths vlrl-$f"; decode_paths="$decode_paths engine-$f"; done
  python3 bench/gpu_engine_decode.py --size 8b --paths $decode_paths --rows 16 32 --completion 256 \
    --out $RESULTS > $RESULTS/decode_packed.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths $paths --generation-batch ${GEN:-32} --out $RESULTS \
    > $RESULTS/gspo_packed_256.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths $paths --generation-batch ${GEN:-32} \
    --out $RESULTS > $RESULTS/gspo_packed_1024.log 2>&1
}

plan_qwen35() {
  TINY=$(python3 -c "from vlrl import config, warmstart; print(warmstart.model_path(config.preset('tiny-qwen3.5')))" \
    2>/dev/null | tail -1)
  python3 bench/gpu_engine_decode.py --tiny "$TINY" --paths --out $RESULTS > $RESULTS/agreement_qwen35.log 2>&1
  for size in qwen3.5-2b qwen3.5-9b; do
    python3 bench/gpu_engine_decode.py --size $size --paths generate engine --rows 16 32 --completion 256 \
      --out $RESULTS > $RESULTS/decode_$size.log 2>&1
  done
  python3 bench/gpu_gspo.py --size qwen3.5-2b --backend bf16 --fast-generation --micro-batch 4 --completion 1024 \
    --steps 2 --out $RESULTS > $RESULTS/gspo_qwen3.5-2b_bf16.log 2>&1
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS \
    > $RESULTS/gspo_qwen3.5-9b_trl.log 2>&1
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 1024 --paths vlrl vlrl-int8 --generation-batch 16 \
    --micro-batch 4 --out $RESULTS > $RESULTS/gspo_qwen3.5-9b_vlrl.log 2>&1
}

plan_s39() {  # issue 36's GPU rows at 256 tokens side by side, the 9B preset's shape for memory, then a profile of the 8B
  # int8 decoding step (issue 32: where the 17.6 ms go)
  python3 bench/gpu_engine.py --size qwen3.5-2b --bf16 --completion 256 --paths trl vlrl --generation-batch 8 \
    --out $RESULTS > $RESULTS/gspo_qwen3.5-2b_256.log 2>&1
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 256 --paths trl vlrl-int8 --generation-batch 8 \
    --out $RESULTS > $RESULTS/gspo_qwen3.5-9b_256.log 2>&1
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 1536 --paths vlrl-int8 --generation-batch 8 --steps 1 \
    --warmup 0 --out $RESULTS > $RESULTS/gspo_qwen3.5-9b_1536.log 2>&1
  python3 bench/gpu_engine_decode.py --size 8b --paths engine-int8 --rows 16 --completion 256 --profile \
    --out $RESULTS > $RESULTS/profile_8b.log 2>&1
}

plan_grouped() {  # after the grouped decode attention and autocast: the 8B int8 decoding step profiled again, then the
  # GSPO steps against plain TRL at 256 (32 at once) and 1024 tokens (the preset's 16 at once)
  python3 bench/gpu_engine_decode.py --size 8b --paths engine-int8 --rows 16 --completion 256 --profile \
    --out $RESULTS > $RESULTS/profile_8b_grouped.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths trl vlrl-int8 --generation-batch 32 --out $RESULTS \
    > $RESULTS/gspo_256.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --generation-batch 16 --out $RESULTS \
    > $RESULTS/gspo_int8_1024.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS \
    > $RESULTS/gspo_trl_1024.log 2>&1
}

plan_s40() {  # after the LoRA weights rounded once per decode: plain TRL (its allocator as a user has it) and vlrl
  # (expandable segments, as `vlrl run` sets them) at 256 tokens, 32 at once, vlrl at micro-batch 8 then 4; the 8B int8
  # decoding step profiled (host and GPU); the 8B preset's shape at 1024 tokens for its memory; plain TRL at 1024
  local vlrl_env="env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths trl --out $RESULTS > $RESULTS/gspo_trl_256.log 2>&1
  $vlrl_env python3 bench/gpu_engine.py --size 8b --completion 256 --paths vlrl-int8 --generation-batch 32 \
    --micro-batch 8 --out $RESULTS/micro8 > $RESULTS/gspo_int8_256_micro8.log 2>&1
  $vlrl_env python3 bench/gpu_engine_decode.py --size 8b --paths engine-int8 --rows 16 --completion 256 --profile \
    --out $RESULTS > $RESULTS/profile_8b_s40.log 2>&1
  $vlrl_env python3 bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --generation-batch 16 \
    --out $RESULTS > $RESULTS/gspo_int8_1024.log 2>&1
  $vlrl_env python3 bench/gpu_engine.py --size 8b --completion 256 --paths vlrl-int8 --generation-batch 32 \
    --micro-batch 4 --out $RESULTS/micro4 > $RESULTS/gspo_int8_256_micro4.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS \
    > $RESULTS/gspo_trl_1024.log 2>&1
}

plan_s40b() {  # the Qwen3.5 9B preset's shape (1536 tokens, 8 at once, micro-batch 2) for its memory, then the 8B
  # preset's shape at micro-batch 8: does it fit 22 GiB, and how much faster is it? Both with expandable segments
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 1536 --paths vlrl-int8 --generation-batch 8 \
    --micro-batch 2 --steps 1 --warmup 0 --out $RESULTS/micro2 > $RESULTS/gspo_qwen3.5-9b_1536_micro2.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --generation-batch 16 --micro-batch 8 \
    --out $RESULTS/micro8 > $RESULTS/gspo_int8_1024_micro8.log 2>&1
}

crafter_2b_step() {  # two steps of one generation batch of the 2B Crafter preset through the one core, evals left out;
  # crafter_2b_step NAME [--set ...]: more settings (the preset's generation batch, say) under another name
  local name=${1:-c2b-core}; shift || true
  (source bench/rehearsal.sh
   checkpoints 2b
   VLRL_SKIP_EVALS=1 JOB_TIMEOUT=900 rehearse $name qwen3-vl-2b-crafter \
     --set model.name_or_path=/tmp/ckpt/qwen3-vl-2b-random --set training.max_steps=2 --set env.eval_seeds=8 \
     --set training.gradient_accumulation_steps=2 "$@"
   cp /tmp/results/$name.tar.gz $RESULTS/) > $RESULTS/crafter_2b_$name.log 2>&1
}

plan_s40c() {  # the 2B Crafter preset through the one core and the engine: two steps of one generation batch (8
  # episodes; the preset's step plays 16), evals left out, for its projected hours; then the Qwen3.5 9B preset's shape
  # at micro-batch 1 (at 2 it reserved 22.4 GiB). Expandable segments, as `vlrl run` sets them
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  crafter_2b_step
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 1536 --paths vlrl-int8 --generation-batch 8 \
    --micro-batch 1 --steps 1 --warmup 1 --out $RESULTS/micro1 > $RESULTS/gspo_qwen3.5-9b_1536_micro1.log 2>&1
}

plan_s40d() {  # the Qwen3.5 9B preset's shape at micro-batch 1, decoding 16 at once instead of 8: does it fit?
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  python3 bench/gpu_engine.py --size qwen3.5-9b --completion 1536 --paths vlrl-int8 --generation-batch 16 \
    --micro-batch 1 --steps 1 --warmup 1 --out $RESULTS/micro1 > $RESULTS/gspo_qwen3.5-9b_1536_micro1_gen16.log 2>&1
}

plan_s41() {  # the decoding step with q/k/v and gate/up each computed as one (vlrl.engine.fusion): profiled with the
  # fusion off and on, one process each; then the GSPO step against plain TRL at 256 and 1024 tokens, the 8B preset's
  # shapes (micro-batch 4; 32 and 16 at once), vlrl's processes with expandable segments as `vlrl run` sets them
  local vlrl_env="env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
  $vlrl_env python3 bench/gpu_engine_decode.py --size 8b --paths engine-int8-layerwise engine-int8 --rows 16 \
    --completion 256 --profile --out $RESULTS > $RESULTS/profile_8b_s41.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 256 --paths trl --out $RESULTS > $RESULTS/gspo_trl_256.log 2>&1
  $vlrl_env python3 bench/gpu_engine.py --size 8b --completion 256 --paths vlrl-int8 --generation-batch 32 \
    --micro-batch 4 --out $RESULTS/micro4 > $RESULTS/gspo_int8_256_micro4.log 2>&1
  $vlrl_env python3 bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --generation-batch 16 \
    --out $RESULTS > $RESULTS/gspo_int8_1024.log 2>&1
  python3 bench/gpu_engine.py --size 8b --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS \
    > $RESULTS/gspo_trl_1024.log 2>&1
}

plan_s41b() {  # the decode table again, each row the fastest of three calls (layer by layer, then fused); issue 36's
  # rows not yet run: the Qwen3.5 2B and 4B MathVista presets' shapes (bf16, 1536 tokens, 8 at once, micro-batch 4)
  # for memory and the mismatch; then the 2B Crafter preset's step through the core, as in s40c
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  python3 bench/gpu_engine_decode.py --size 8b --paths engine-int8-layerwise engine-int8 --rows 16 32 \
    --completion 256 --out $RESULTS/repeats > $RESULTS/decode_8b_s41b.log 2>&1
  for size in qwen3.5-2b qwen3.5-4b; do
    python3 bench/gpu_engine.py --size $size --bf16 --completion 1536 --paths vlrl --generation-batch 8 \
      --micro-batch 4 --steps 1 --warmup 1 --out $RESULTS/$size > $RESULTS/gspo_${size}_1536.log 2>&1
  done
  crafter_2b_step
}

plan_s41c() {  # the Qwen3.5 2B and 4B presets' shapes over 22 GiB at micro-batch 4 (22.7 and 27.8 GiB reserved): the 2B
  # at micro-batch 2, the 4B at 1
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  python3 bench/gpu_engine.py --size qwen3.5-2b --bf16 --completion 1536 --paths vlrl --generation-batch 8 \
    --micro-batch 2 --steps 1 --warmup 0 --out $RESULTS/qwen3.5-2b-micro2 > $RESULTS/gspo_qwen3.5-2b_1536_micro2.log 2>&1
  python3 bench/gpu_engine.py --size qwen3.5-4b --bf16 --completion 1536 --paths vlrl --generation-batch 8 \
    --micro-batch 1 --steps 1 --warmup 0 --out $RESULTS/qwen3.5-4b-micro1 > $RESULTS/gspo_qwen3.5-4b_1536_micro1.log 2>&1
}

plan_s42() {  # after fusion: the 2B Crafter preset's step through the core (one generation batch of 8, as the preset,
  # then the step's 16 episodes at once), then s41c's Qwen3.5 rows (the 2B at micro-batch 2, the 4B at 1)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  crafter_2b_step c2b-fused
  crafter_2b_step c2b-fused-gen16 --set training.generation_batch_size=16 --set training.gradient_accumulation_steps=4
  plan_s41c
}

plan_s43() {  # the 2B Crafter preset's step through the fused engine with the step's 16 episodes decoded at once (two
  # steps; each logs its rollout_time), then the qwen3.5-2b-crafter preset's step for its memory (issue 36)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  crafter_2b_step c2b-gen16 --set training.generation_batch_size=16 --set training.gradient_accumulation_steps=4
  OUT=$RESULTS/q35crafter bash bench/qwen35_crafter_step.sh > $RESULTS/q35crafter.log 2>&1
}

crafter_8b_step() {  # two steps of one generation batch of the 8B Crafter preset through the one core (4-bit, the
  # base repacked to int8 for decoding), evals left out; crafter_8b_step NAME [--set ...]
  local name=${1:-c8b-core}; shift || true
  (source bench/rehearsal.sh
   checkpoints 8b
   VLRL_SKIP_EVALS=1 JOB_TIMEOUT=1700 rehearse $name qwen3-vl-8b-crafter \
     --set model.name_or_path=/tmp/ckpt/qwen3-vl-8b-random-bnb4 --set training.max_steps=2 --set env.eval_seeds=8 \
     --set training.gradient_accumulation_steps=2 "$@"
   cp /tmp/results/$name.tar.gz $RESULTS/) > $RESULTS/crafter_8b_$name.log 2>&1
}

plan_s44() {  # the 8B Crafter preset's step through the one core and the fused engine (8 episodes a step, 4 at once)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  crafter_8b_step c8b-core
}

plan_s45() {  # after the merged turn scoring (vlrl.episodes.scoring) and the Crafter presets keeping every observation:
  # the decoding attention at long contexts, then the 2B and 8B Crafter presets' steps through the core
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s51
  python3 bench/gpu_decode_attention.py --out $RESULTS/attention > $RESULTS/attention.log 2>&1
  crafter_2b_step c2b-merged
  crafter_8b_step c8b-merged
}

plan_s46() {  # the episode's KV cache kept across turns (vlrl.engine.session): the 2B Crafter preset's step with the
  # kept cache (its whole-prefill row ran with a switch of rehearsal_cli.py that patched the engine, in git at
  # 66c797f: check that commit out to run it again); the 8B adapter's read-back gap
  # (bench/gpu_reload_gap.py, after its probes left gemlite's kernels); then the 8B Crafter preset's step
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  crafter_2b_step c2b-session
  timeout 420 python3 bench/gpu_reload_gap.py --out $RESULTS/reload > $RESULTS/reload.log 2>&1
  crafter_8b_step c8b-session
}

side_by_side() {  # side_by_side NAME PATH SHAPE_ARGS...: plain TRL (TRL_WARMUP warm-up steps first), then vlrl's PATH
  local name=$1 path=$2; shift 2
  python3 bench/gpu_engine.py "$@" --paths trl --steps 1 --warmup "${TRL_WARMUP:-0}" --out ${SIDE_DIR:-$RESULTS/s50} \
    > $RESULTS/${name}_trl.log 2>&1
  python3 bench/gpu_engine.py "$@" --paths "$path" --steps 1 --warmup 1 --out ${SIDE_DIR:-$RESULTS/s50} > $RESULTS/${name}_vlrl.log 2>&1
}

plan_s50() {  # issue 50 points 1-3 (engine_results.py reads $RESULTS/s50; s51 too): the presets' shapes, most-used first.
  # 2026-11-29 ran 8b_256 only (engine_runs.json#s50): plain TRL's first step there took 48.8 s against 27.5 s for its
  # second, so at 256 tokens TRL gets a warm-up step (at 1,024 its ~185 s step dwarfs that). First: the update pass
  # by rows on both bases (bench/gpu_update.py, ~2 min), what point 2 is to be decided from.
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  python3 bench/gpu_update.py --completion 256 --out $RESULTS/s50/update > $RESULTS/update_256.log 2>&1
  side_by_side 8b_1024 vlrl-int8 --size 8b --completion 1024 --generation-batch 16 --micro-batch 4
  TRL_WARMUP=1 side_by_side 8b_256 vlrl-int8 --size 8b --completion 256 --generation-batch 16 --micro-batch 4
  # [training] pass_tokens = 6144: at 256 tokens two micro-batches of 4 a pass (8 rows), at 1,024 one (the preset as is)
  for c in 256 1024; do python3 bench/gpu_engine.py --size 8b --completion $c --generation-batch 16 --micro-batch 4 \
    --pass-tokens 6144 --paths vlrl-int8 --steps 1 --warmup 1 --out $RESULTS/s50/pass6144 > $RESULTS/pass6144_$c.log 2>&1; done
  side_by_side 2b_1024 vlrl --size 2b --bf16 --completion 1024 --generation-batch 8 --micro-batch 4
  side_by_side 4b_1024 vlrl --size 4b --bf16 --completion 1024 --generation-batch 8 --micro-batch 4
  side_by_side thinking_1536 vlrl-int8 --size 8b --completion 1536 --generation-batch 8 --micro-batch 2
}

plan_s51() {  # issue 50, 2026-12-07: the decoding attention side by side in CUDA graphs (point 4), then the shapes
  # s50 left, most-needed first, with [training] pass_tokens = 6144 on vlrl's path (at 1,024 tokens a no-op: one
  # micro-batch of 4 fills a pass; at 256 two make one); the 8B at 1,024 last (2026-11-27's pair stands if it is cut)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s51
  python3 bench/gpu_decode_attention.py --rows 4 8 16 --lengths 2048 8192 --out $RESULTS/s51/attention \
    > $RESULTS/attention_s51.log 2>&1
  local shape="--generation-batch 16 --micro-batch 4 --pass-tokens 6144"
  TRL_WARMUP=1 side_by_side 8b_256 vlrl-int8 --size 8b --completion 256 $shape
  side_by_side 2b_1024 vlrl --size 2b --bf16 --completion 1024 --generation-batch 8 --micro-batch 4 --pass-tokens 6144
  side_by_side 4b_1024 vlrl --size 4b --bf16 --completion 1024 --generation-batch 8 --micro-batch 4 --pass-tokens 6144
  side_by_side thinking_1536 vlrl-int8 --size 8b --completion 1536 --generation-batch 8 --micro-batch 2
  side_by_side 8b_1024 vlrl-int8 --size 8b --completion 1024 $shape
}

plan_s52() {  # issue 50 (most telling first): the 8B at 256 tokens through vlrl's path in one process, a measured step
  # each at pass_tokens 0, 6144 and 12288 with the training half's parts (PARTS: passes, log-prob forwards, scoring),
  # the update pass by rows on the int8 base with its profile (gpu_update.py: dispatch- or kernel-bound?), the 2B
  # Crafter preset's step with the masked SDPA and with FlexAttention (VLRL_FLEX_ROWS=8, rehearsal_cli.py) one after
  # the other, the decoding attention with vlrl's own FlexAttention path (its engine_flex column), then the thinking
  # preset's pair, which s51 left unfinished, and the presets no session has run side by side at their own shapes
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s52
  python3 bench/gpu_engine.py --size 8b --completion 256 --generation-batch 16 --micro-batch 4 --paths vlrl-int8 \
    --pass-tokens-per-step 0 6144 12288 --warmup 1 --out $RESULTS/s52/passes > $RESULTS/passes_256.log 2>&1
  python3 bench/gpu_update.py --completion 256 --bases int8 --out $RESULTS/s52/update > $RESULTS/update_256.log 2>&1
  crafter_2b_step c2b-sdpa
  (export VLRL_FLEX_ROWS=8; crafter_2b_step c2b-flex)
  python3 bench/gpu_decode_attention.py --rows 4 8 16 --lengths 2048 8192 --out $RESULTS/s52/attention \
    > $RESULTS/attention_s52.log 2>&1
  side_by_side thinking_1536 vlrl-int8 --size 8b --completion 1536 --generation-batch 8 --micro-batch 2
  side_by_side testmini_1024 vlrl-int8 --size 8b --completion 1024 --generation-batch 8 --micro-batch 4
  side_by_side qwen35_2b_1536 vlrl --size qwen3.5-2b --bf16 --completion 1536 --generation-batch 8 --micro-batch 2
  side_by_side qwen35_4b_1536 vlrl --size qwen3.5-4b --bf16 --completion 1536 --generation-batch 8 --micro-batch 1
  side_by_side qwen35_9b_1536 vlrl-int8 --size qwen3.5-9b --completion 1536 --generation-batch 8 --micro-batch 1
}

plan_s52a() {  # plan s52's first measurement alone, for a session left with ~7 device-minutes: the 8B at 256 tokens
  # through vlrl's path, a measured step each at pass_tokens 0, 6144 and 12288, with the training half's parts
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  python3 bench/gpu_engine.py --size 8b --completion 256 --generation-batch 16 --micro-batch 4 --paths vlrl-int8 \
    --pass-tokens-per-step 0 6144 12288 --warmup 1 --out $RESULTS/s52/passes > $RESULTS/passes_256.log 2>&1
}

plan_s53() {  # issue 50 after the chunked loss scoring (vlrl.training.chunked_scoring): plain TRL at 256 tokens (a
  # warm-up step, then one), then vlrl's path in one process a measured step each at pass_tokens 0, 6144 and 12288 (the
  # training half's parts: PARTS), the same at 1,024 tokens at 0, 12288 and 24576 (passes of 4, 8 and 16 rows: what the
  # logits no longer held whole let fit, each step's peak in its steps entry), then the rest of s52
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s53
  local shape="--size 8b --generation-batch 16 --micro-batch 4"
  python3 bench/gpu_engine.py $shape --completion 256 --paths trl --steps 1 --warmup 1 --out $RESULTS/s53 \
    > $RESULTS/8b_256_trl.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 256 --paths vlrl-int8 --pass-tokens-per-step 0 6144 12288 \
    --warmup 1 --out $RESULTS/s53/passes > $RESULTS/passes_256.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 1024 --paths vlrl-int8 --pass-tokens-per-step 0 12288 24576 \
    --warmup 1 --out $RESULTS/s53/passes > $RESULTS/passes_1024.log 2>&1
  python3 bench/gpu_update.py --completion 256 --bases int8 --out $RESULTS/s53/update > $RESULTS/update_256.log 2>&1
  crafter_2b_step c2b-sdpa
  (export VLRL_FLEX_ROWS=8; crafter_2b_step c2b-flex)
  side_by_side thinking_1536 vlrl-int8 --size 8b --completion 1536 --generation-batch 8 --micro-batch 2
}

plan_s54() {  # issue 50 point 2: the update pass by rows on the int8 base with the language model's decoder layers
  # eager and compiled (bench/gpu_update.py --compiled both), then the 8B at 256 tokens again (plain TRL, vlrl at the
  # preset's pass_tokens 12288): the decoding rate on another machine than s53's
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s54
  python3 bench/gpu_update.py --completion 256 --bases int8 --compiled both --rows 1 4 8 16 --out $RESULTS/s54/update \
    > $RESULTS/update_256.log 2>&1
  local shape="--size 8b --generation-batch 16 --micro-batch 4"
  python3 bench/gpu_engine.py $shape --completion 256 --paths trl --steps 1 --warmup 1 --out $RESULTS/s54 \
    > $RESULTS/8b_256_trl.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 256 --paths vlrl-int8 --pass-tokens-per-step 12288 \
    --warmup 1 --out $RESULTS/s54/passes > $RESULTS/passes_256.log 2>&1
}

plan_s55() {  # issue 50 after the compiled decoder layers ([training] compiled_layers, on by default) with gemlite's
  # wheel back in .whl (s53-s54 decoded through the dequantized weight): the 8B at 256 tokens (plain TRL, then vlrl at
  # pass_tokens 12288 and 24576), the 2B Crafter step (the episode trainer's passes compiled too), the 8B at 1,024
  # (vlrl at 12288), then the 8B at 256 with the layers eager (the same step, layers as TRL runs them)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s55
  local shape="--size 8b --generation-batch 16 --micro-batch 4"
  python3 bench/gpu_engine.py $shape --completion 256 --paths trl --steps 1 --warmup 1 --out $RESULTS/s55 \
    > $RESULTS/8b_256_trl.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 256 --paths vlrl-int8 --pass-tokens-per-step 12288 24576 \
    --warmup 1 --out $RESULTS/s55/passes > $RESULTS/passes_256.log 2>&1
  crafter_2b_step c2b-compiled
  python3 bench/gpu_engine.py $shape --completion 1024 --paths vlrl-int8 --pass-tokens-per-step 12288 \
    --warmup 1 --out $RESULTS/s55/passes > $RESULTS/passes_1024.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 256 --paths vlrl-int8 --pass-tokens-per-step 12288 \
    --compiled-layers 0 --warmup 1 --out $RESULTS/s55/eager > $RESULTS/eager_256.log 2>&1
}

plan_s56() {  # issue 50 with every layer compiled (the fusion guard fixed after s55), most telling first: the 8B at
  # 256 tokens (plain TRL, then vlrl at 12288 and 24576), the 8B at 1,024 (plain TRL's one step, vlrl at 12288), the
  # 2B Crafter step, then the 8B at 256 with the layers eager, then the thinking preset's pair
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIDE_DIR=$RESULTS/s56
  local shape="--size 8b --generation-batch 16 --micro-batch 4"
  python3 bench/gpu_engine.py $shape --completion 256 --paths trl --steps 1 --warmup 1 --out $RESULTS/s56 \
    > $RESULTS/8b_256_trl.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 256 --paths vlrl-int8 --pass-tokens-per-step 12288 24576 \
    --warmup 1 --out $RESULTS/s56 > $RESULTS/passes_256.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS/s56 \
    > $RESULTS/8b_1024_trl.log 2>&1
  python3 bench/gpu_engine.py $shape --completion 1024 --paths vlrl-int8 --pass-tokens-per-step 12288 \
    --warmup 1 --out $RESULTS/s56 > $RESULTS/passes_1024.log 2>&1
  crafter_2b_step c2b-compiled
  python3 bench/gpu_engine.py $shape --completion 256 --paths vlrl-int8 --pass-tokens-per-step 12288 24576 \
    --compiled-layers 0 --warmup 1 --out $RESULTS/s56/eager > $RESULTS/eager_256.log 2>&1
  side_by_side thinking_1536 vlrl-int8 --size 8b --completion 1536 --generation-batch 8 --micro-batch 2
}

S57_SHAPE="--size 8b --generation-batch 16 --micro-batch 4"

s57_trl_256() {  # s57_trl_256 DIR: plain TRL at 256 tokens, a warm-up step, then three
  python3 bench/gpu_engine.py $S57_SHAPE --completion 256 --paths trl --steps 3 --warmup 1 --out $RESULTS/$1 \
    > $RESULTS/8b_256_trl.log 2>&1
}

s57_at_256() {  # the 8B at 256 tokens, three measured steps a setting: plain TRL, then vlrl eager, then compiled
  local passes="12288 12288 12288 24576 24576 24576"
  s57_trl_256 s57
  python3 bench/gpu_engine.py $S57_SHAPE --completion 256 --paths vlrl-int8 --pass-tokens-per-step $passes \
    --compiled-layers 0 --warmup 1 --out $RESULTS/s57/eager > $RESULTS/eager_256.log 2>&1
  python3 bench/gpu_engine.py $S57_SHAPE --completion 256 --paths vlrl-int8 --pass-tokens-per-step $passes \
    --warmup 1 --out $RESULTS/s57 > $RESULTS/passes_256.log 2>&1
}

s57_vlrl_1024() {  # s57_vlrl_1024 DIR LOG [ARGS]: vlrl alone at the 8B preset's own 1,024 tokens, two steps
  local out=$1 log=$2; shift 2
  python3 bench/gpu_engine.py $S57_SHAPE --completion 1024 --paths vlrl-int8 --pass-tokens-per-step 12288 12288 \
    --warmup 1 --out $RESULTS/$out "$@" > $RESULTS/$log 2>&1
}

s57_trl_1024() {  # s57_trl_1024 DIR: plain TRL's one step at the 8B preset's 1,024 tokens (eager, nothing to compile)
  python3 bench/gpu_engine.py $S57_SHAPE --completion 1024 --paths trl --steps 1 --warmup 0 --out $RESULTS/$1 \
    > $RESULTS/8b_1024_trl.log 2>&1
}

plan_s57() {  # s56's 8B rows, three measured steps a setting: plain TRL, vlrl eager, vlrl compiled at 256 tokens,
  # then plain TRL's one step and vlrl compiled at 1,024, then the 2B Crafter step
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  s57_at_256
  s57_trl_1024 s57
  s57_vlrl_1024 s57 passes_1024.log
  crafter_2b_step c2b-parts  # its train log splits each rollout: rollout/prefill_time, rollout/decode_ms_per_step
}

plan_s57b() {  # s57 within a session that lost a machine start: the 8B at 256 tokens (three measured steps a
  # setting), the 2B Crafter step with its rollout split, then vlrl alone at 1,024 (its decoding split)
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  s57_at_256
  crafter_2b_step c2b-parts
  s57_vlrl_1024 s57 passes_1024.log
}

plan_s57c() {  # what s57b's lost machine left out, in the session's last 560 device-seconds: the 8B preset's shape at its
  # own 1,024 tokens, decoder layers eager (no compile, to fit), for the decoding steps' own share of the bound
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  s57_vlrl_1024 s57c eager_1024.log --compiled-layers 0
}

plan_s58() {  # s57 in a session left ~1,300 device-seconds by failed starts (2026-12-08), most telling first: the 8B at
  # 256 tokens, three measured steps a setting (plain TRL; vlrl with its layers compiled at both pass sizes; then eager
  # at the preset's 12,288, Inductor's caches warm), then vlrl compiled at the preset's 1,024 (two steps: its decoding
  # split and update), then plain TRL's one step at 1,024 (its update); no Crafter step
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  s57_trl_256 s58
  python3 bench/gpu_engine.py $S57_SHAPE --completion 256 --paths vlrl-int8 \
    --pass-tokens-per-step 12288 12288 12288 24576 24576 24576 --warmup 1 --out $RESULTS/s58 > $RESULTS/passes_256.log 2>&1
  python3 bench/gpu_engine.py $S57_SHAPE --completion 256 --paths vlrl-int8 --pass-tokens-per-step 12288 12288 12288 \
    --compiled-layers 0 --warmup 1 --out $RESULTS/s58/eager > $RESULTS/eager_256.log 2>&1
  s57_vlrl_1024 s58 passes_1024.log
  s57_trl_1024 s58
}

plan_s59() {  # what s58 left out, for a session's first call: the 8B preset's own 1,024 tokens, vlrl with its layers
  # compiled (a compiling step, then two: the logged decoding share and the update), then plain TRL's one step there
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  s57_vlrl_1024 s59 passes_1024.log
  s57_trl_1024 s59
}

wait_for() {  # wait_for SECONDS: until the jobs end or the time is up
  local until=$(( $(date +%s) + $1 ))
  while [ -f $RESULTS/.running ] && [ $(date +%s) -lt $until ]; do sleep 5; done
  [ -f $RESULTS/.running ] && echo "still running" || echo "jobs done"
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced by the jobs' own shell: the functions only
case "$1" in
  start)
    touch $RESULTS/.running
    # setsid: the jobs outlive this call (a plain background job ends with it)
    setsid bash -c "source bench/engine_jobs.sh; plan_$2; rm -f $RESULTS/.running" > $RESULTS/jobs.log 2>&1 < /dev/null &
    wait_for "$3" ;;
  wait) wait_for "$2" ;;
esac
copy_out
