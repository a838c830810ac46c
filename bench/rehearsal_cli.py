"""The vlrl CLI, unchanged, with one addition for random-weight rehearsals: a reward that random completions earn.

    python bench/rehearsal_cli.py train --preset qwen3-vl-2b-mathvista --set model.name_or_path=/tmp/ckpt/... ...
    accelerate launch --config_file vlrl/accelerate_configs/fsdp.yaml bench/rehearsal_cli.py train ...

A checkpoint with random weights writes random tokens: no tags, no answer, so the preset's rewards are 0 for every
completion, every advantage is 0, GSPO's gradient is 0 and `vlrl train` rightly refuses the untrained adapter. Here
the correctness reward also pays the share of a completion's characters that are ASCII letters (0 to 1), which differs
between random completions of one prompt: the steps then train the LoRA weights for real (non-zero gradients, Adam
updates, a non-zero adapter to save and verify), at the same cost per step as the preset's own rewards.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl import rewards
from vlrl.cli import main


def _text(completion) -> str:
    return completion if isinstance(completion, str) else str(completion[-1].get("content", ""))


def with_letter_share(correctness):
    """`correctness` plus the share of ASCII letters in each completion (a skipped correctness counts 0)."""

    @functools.wraps(correctness)
    def reward(completions, answer, **kwargs):
        scores = correctness(completions, answer, **kwargs)
        return [(score or 0.0) + sum(ch.isascii() and ch.isalpha() for ch in _text(c)) / max(1, len(_text(c)))
                for score, c in zip(scores, completions)]

    return reward


_preset_rewards = rewards.reward_funcs
rewards.reward_funcs = lambda symbolic=False: [f if i == 0 else with_letter_share(f)
                                                for i, f in enumerate(_preset_rewards(symbolic))]

if __name__ == "__main__":
    sys.exit(main())
