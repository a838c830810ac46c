#!/usr/bin/env bash
# GPU smoke run (device machine): install the carried wheels, then the tiny loop with each backend.
#   carry [".whl"]; OUT is the folder that comes back.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD VLRL_CACHE=/tmp/vlrl-cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, trl, peft, datasets; print('torch', torch.__version__, 'tf', transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__)"
for mode in "$@"; do
  case $mode in
    tiny-transformers) timeout 240 python3 -m vlrl run --preset tiny --output-dir /tmp/tiny_tf > $OUT/tiny_tf.log 2>&1; echo "tiny-transformers rc=$?"; cp /tmp/tiny_tf/train_log.jsonl $OUT/tiny_tf_train_log.jsonl 2>/dev/null ;;
    tiny-unsloth) timeout 300 python3 -m vlrl run --preset tiny-gpu --output-dir /tmp/tiny_unsloth > $OUT/tiny_unsloth.log 2>&1; echo "tiny-unsloth rc=$?"; cp /tmp/tiny_unsloth/train_log.jsonl $OUT/tiny_unsloth_train_log.jsonl 2>/dev/null ;;
  esac
done
for f in $OUT/*.log; do echo "== $f"; tr '\r' '\n' < $f | grep -v "it/s\]\|s/it\]\|item/s\]\|step/s\]\|s/step\]" | tail -25; done
