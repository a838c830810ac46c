#!/usr/bin/env bash
# Issue 46's GPU measurements (bench/gpu_unsloth.py), run in the background on the device machine so that they outlive
# one call; results and logs go to /tmp/results/unsloth, packed into $OUT/unsloth.tgz by each call.
#   bash bench/unsloth_jobs.sh start SECONDS   # starts the jobs, waits up to SECONDS, packs what is there
#   bash bench/unsloth_jobs.sh wait SECONDS    # a later call (within the machine's 30 s warm window)
# Carry [".whl"]. The jobs, one process each, in turn: the failure reproduced on Unsloth's own trainer (2B shape),
# then at the 8B shape at 256 and 1024 tokens: vlrl on Unsloth, Unsloth's notebook configuration, the preset's path
# (transformers + the engine, int8-packed base), plain TRL.
set -uo pipefail
source bench/device_setup.sh
R=/tmp/results/unsloth
mkdir -p $R
# run folders hold checkpoints and adapters: only the JSON, logs and train logs come back (at most 16 MiB a file)
pack() { tar -czf "$OUT/unsloth.tgz" --exclude=checkpoints --exclude='adapter-*' -C /tmp/results unsloth
         tail -n 25 $R/*.log | cut -c1-400; }
if [ "$1" = start ]; then
  # the jobs run from a copy: a later call sends the working tree again, replacing this folder under them
  rm -rf /tmp/unsloth-bench && cp -r . /tmp/unsloth-bench && cd /tmp/unsloth-bench || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  setsid bash -c "nvidia-smi -L > $R/gpu.txt
    for p in repro vlrl-unsloth unsloth vlrl trl; do
      python3 bench/gpu_unsloth.py --path \$p --out $R > $R/\$p.log 2>&1
    done; touch $R/done" < /dev/null > /dev/null 2>&1 &
fi
end=$((SECONDS + $2))
while [ $SECONDS -lt $end ] && [ ! -f $R/done ]; do sleep 5; done
pack
