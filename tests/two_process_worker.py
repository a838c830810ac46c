"""The library side of tests/test_distributed.py, run in one process or under `accelerate launch`: GSPO steps on
the tiny model over fixed rollouts (the trainer is vlrl's, `vlrl.training.train.build_trainer`; only the rollouts are fixed),
then, when given a run directory, `vlrl train --resume` of it in the same processes (one launch instead of two: the
imports of a launch cost more than its steps).

    accelerate launch --config_file vlrl/accelerate_configs/ddp.yaml tests/two_process_worker.py OUT PER_DEVICE STEPS \
        [RUN_DIR_TO_RESUME]        # VLRL_WORKER_OVERRIDES="training.a=1;training.b=2": more settings

Each process writes OUT/rank<k>.safetensors (its LoRA weights after the steps) and OUT/rank<k>.json (the prompts it
generated for). Why fixed: TRL seeds every process differently (`set_seed(seed, device_specific=True)`), so sampled
completions depend on the number of processes, and two launches of different sizes never train on the same
rollouts. Here each prompt's group of completions is a fixed function of the prompt (canned answers of different
format, so a group's rewards differ and its advantages are not zero); everything else is the real step.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

# answers of every quality the format reward tells apart: a group of four gets different rewards
CANNED = ("<REASONING>I count the marks one by one.</REASONING><SOLUTION>3</SOLUTION>",
          "<SOLUTION>5</SOLUTION>",
          "The answer is 2.",
          "<REASONING>The chart shows it.</REASONING>")


def fixed_rollouts(trainer, processor, seen: list) -> None:
    """Replaces the trainer's generation: the j-th copy of a prompt in a batch gets CANNED[(hash + j) % 4], the same
    in any process, whatever the batch holds besides (two items with the same prompt text, whose images give the
    same placeholder tokens, count on from 4 to 7: the same answers, as a group is 4 copies)."""
    tokenizer = processor.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    canned = [tokenizer.encode(text, add_special_tokens=False) + [end] for text in CANNED]

    def generate(prompt_ids, *args, **kwargs):
        copies: dict[tuple, int] = {}
        completions = []
        for ids in prompt_ids:
            key = tuple(ids)
            j = copies[key] = copies.get(key, -1) + 1
            completions.append(list(canned[(zlib.crc32(str(key).encode()) + j) % len(canned)]))
            if j == 0:
                seen.append(zlib.crc32(str(key).encode()))
        return completions, None

    trainer.generate_rollouts = generate


def train_steps(run_dir: str | Path, per_device: int, steps: int, overrides: tuple = ()) -> tuple[dict, list]:
    """`steps` GSPO steps of the tiny preset (per-device batch `per_device`, 4 generations, and `overrides`) over
    fixed rollouts; returns (LoRA weights by name, the crc32 of each prompt this process generated for)."""
    from vlrl import run
    from vlrl.config import runfile as cfg
    from vlrl.training import train

    config = cfg.preset("tiny", overrides=[f"training.per_device_train_batch_size={per_device}",
                                           f"training.max_steps={steps}", "training.save_steps=1000", *overrides])
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    policy, processor = run.load_policy(config, log=lambda *_: None)
    train_ds, _ = run.prepare(config, processor, log=lambda *_: None)
    trainer = train.build_trainer(config, policy, processor, train_ds, run_dir, log=lambda *_: None)
    seen: list = []
    fixed_rollouts(trainer, processor, seen)
    trainer.train()
    return {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}, seen


if __name__ == "__main__":
    from safetensors.torch import save_file

    from vlrl.base import distributed
    from vlrl.cli import main

    out, per_device, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    overrides = tuple(filter(None, os.environ.get("VLRL_WORKER_OVERRIDES", "").split(";")))  # e.g. a=1;b=2
    weights, seen = train_steps(out / "run", per_device, steps, overrides)
    save_file(weights, str(out / f"rank{distributed.rank()}.safetensors"))
    (out / f"rank{distributed.rank()}.json").write_text(json.dumps(seen))
    if len(sys.argv) > 4:
        sys.exit(main(["train", "--run-dir", sys.argv[4], "--resume"]))  # main leaves the process group
    distributed.end(exit_code=0)
