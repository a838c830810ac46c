#!/usr/bin/env bash
# Issue 46's GPU measurements, run in the background on the device machine so that they outlive one call; results
# and logs go to /tmp/results/unsloth, packed into $OUT/unsloth.tgz by each call.
#   bash bench/unsloth_jobs.sh start SECONDS   # starts the jobs, waits up to SECONDS, packs what is there
#   bash bench/unsloth_jobs.sh wait SECONDS    # a later call (within the machine's 30 s warm window)
# Carry [".whl"] (the wheel set of ../shared/device/make-wheels.sh plus nbclient and ipykernel with their
# dependencies, for the walkthrough). The jobs: the 8B checkpoint built while the walkthrough runs on the tiny-gpu
# preset (Unsloth); then one process per path at the 8B shape, 256 then 1024 tokens: vlrl on Unsloth (the adapter
# exported and verified at the end), the preset's path (transformers + the engine, int8-packed base), Unsloth's
# notebook configuration, plain TRL. Every job stops at DEADLINE seconds after the start (the machine is held at most
# 30 minutes); a row not reached says so in its log.
# WALKTHROUGH=0 leaves the walkthrough out; JOBS="name:args;name:args" replaces the chain of gpu_unsloth.py runs, e.g.
#   JOBS="vlrl-unsloth:--path vlrl-unsloth --lengths 1024 --steps 1 --generation-batch 32;unsloth:--path unsloth --lengths 1024 --steps 1"
set -uo pipefail
source bench/device_setup.sh
R=/tmp/results/unsloth
DEADLINE=${DEADLINE:-1440}
WALKTHROUGH=${WALKTHROUGH:-1}
export JOBS=${JOBS:-"vlrl-unsloth:--path vlrl-unsloth --steps 2 1;vlrl:--path vlrl --steps 2;unsloth:--path unsloth --steps 2 1;trl:--path trl"}
mkdir -p $R
# run folders hold checkpoints and adapters: only the JSON, logs and train logs come back (at most 16 MiB a file)
pack() { tar -czf "$OUT/unsloth.tgz" --exclude=checkpoints --exclude='adapter-*' --exclude=jupyter \
           -C /tmp/results unsloth
         tail -n 6 $R/*.log | cut -c1-300; }
if [ "$1" = start ]; then
  # the jobs run from a copy: a later call sends the working tree again, replacing this folder under them
  rm -rf /tmp/unsloth-bench && cp -r . /tmp/unsloth-bench && cd /tmp/unsloth-bench || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  setsid bash -c "
    nvidia-smi -L > $R/gpu.txt
    end=\$((SECONDS + $DEADLINE))
    left() { echo \$(( end - SECONDS )); }
    # the walkthrough (a 2-layer model) beside the 8B checkpoint's build and vlrl-on-Unsloth's load and warm-up
    # step; walkthrough.end and the logs' times say which measured step it overlapped, if any
    [ $WALKTHROUGH = 0 ] || (timeout 480 python3 bench/gpu_walkthrough.py --preset tiny-gpu --run-dir /tmp/walkthrough --out $R; date +%s > $R/walkthrough.end) > $R/walkthrough.log 2>&1 &
    python3 -c 'import sys; sys.path.insert(0, \"bench\"); from gpu_gspo import build_checkpoint; from pathlib import Path; print(build_checkpoint(\"8b\", Path(\"/tmp/vlrl-bench\")))' > $R/build.log 2>&1
    one() { name=\$1; shift; [ \$(left) -gt 60 ] || { echo 'not reached: deadline' > $R/\$name.log; return; }
            timeout \$(left) python3 bench/gpu_unsloth.py --out $R \"\$@\" > $R/\$name.log 2>&1; }
    date +%s > $R/measuring.start
    IFS=';' read -ra jobs <<< \"\$JOBS\"
    for job in \"\${jobs[@]}\"; do one \"\${job%%:*}\" \${job#*:}; done
    wait
    touch $R/done" < /dev/null > /dev/null 2>&1 &
fi
end=$((SECONDS + $2))
while [ $SECONDS -lt $end ] && [ ! -f $R/done ]; do sleep 5; done
pack
