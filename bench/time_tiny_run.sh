#!/usr/bin/env bash
# CPU cost of `vlrl run --preset tiny` (warm tiny model already cached in $VLRL_CACHE): wall, user and sys seconds of
# the whole loop, and the GSPO step times from its train_log.jsonl. User + sys is the number to compare on a shared
# machine: wall time there depends on what else runs.
#   bash bench/time_tiny_run.sh [RUN_DIR]
set -euo pipefail
RUN_DIR=${1:-$(mktemp -d)/tiny}
/usr/bin/time -f "wall %e s  user %U s  sys %S s" python -m vlrl run --preset tiny --run-dir "$RUN_DIR" 2>&1 \
  | grep -E "^wall|done in"
python - "$RUN_DIR" <<'PY'
import json, sys
steps = [json.loads(line)["step_time"] for line in open(f"{sys.argv[1]}/train_log.jsonl") if '"step_time"' in line]
print(f"GSPO steps: {len(steps)}, mean step_time {sum(steps) / len(steps):.2f} s")
PY
