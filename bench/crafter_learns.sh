#!/usr/bin/env bash
# Issue 37, the Crafter demonstration on one GPU, on the device machine (carry [".whl"]: the wheel set of
# bench/device_setup.sh, crafter 1.8.3 and its dependencies included):
#   bash bench/crafter_learns.sh [--set SECTION.KEY=VALUE ...]
# runs `vlrl run --config bench/learning/crafter-learns.toml` (the scripted warm start of tiny-small, the 64 held-out
# worlds before, GSPO, the same worlds after, comparison, report, adapter) into /tmp/results/crafter-learns, and copies
# the run directory as one tarball (without checkpoints, adapter weights and frames), its log and the warm start's
# record to $OUT.
# A device command may run 10 minutes: the run stops itself at LIMIT seconds and the next call resumes it (the
# baseline episodes resume, training from its last checkpoint, the episodes after start over), as long as the machine
# is still held; the cache (/tmp/vlrl-cache: the built model and its warm start) stays with it.
set -uo pipefail
source bench/device_setup.sh

LIMIT=${LIMIT:-560}
RUN=/tmp/results/crafter-learns
LOG=/tmp/results/crafter-learns.log
started=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== $(date -u +%FT%TZ) call starts (elapsed before: $(cat /tmp/results/crafter-learns.seconds 2>/dev/null || echo 0) s)" \
  | tee -a "$LOG"
timeout "$LIMIT" python3 -m vlrl run --config bench/learning/crafter-learns.toml --run-dir "$RUN" "$@" 2>&1 \
  | grep --line-buffered -v "it/s]\|s/step]\|step/s]" | tee -a "$LOG"
code=${PIPESTATUS[0]}
seconds=$(( $(date +%s) - started + $(cat /tmp/results/crafter-learns.seconds 2>/dev/null || echo 0) ))
echo "$seconds" > /tmp/results/crafter-learns.seconds
echo "== exit $code, this call $(( $(date +%s) - started )) s, all calls $seconds s" | tee -a "$LOG"
[ "$code" = 124 ] && echo "stopped at $LIMIT s: call again to resume"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  # one file: the device returns a few files a call, and a run directory holds hundreds (its episode frames stay out)
  [ -d "$RUN" ] && tar -czf "$OUT/crafter-learns-run.tar.gz" -C "$(dirname "$RUN")" --exclude=checkpoints \
    --exclude=adapter --exclude=episode_frames "$(basename "$RUN")"
  cp "$LOG" "$OUT/"
  for warm in /tmp/vlrl-cache/small-qwen3-vl-warm-*; do  # the warm starts' settings and loss curves
    for f in warm_start.json sft_log.jsonl; do [ -f "$warm/$f" ] && cp "$warm/$f" "$OUT/$(basename "$warm")-$f"; done
  done
  du -sh "$OUT"
fi
