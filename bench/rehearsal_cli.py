"""The vlrl CLI, unchanged, with two additions for random-weight rehearsals: a reward that random completions earn,
and a clock on the stages of `vlrl run` (with VLRL_STAGES=FILE).

    python bench/rehearsal_cli.py train --preset qwen3-vl-2b-mathvista --set model.name_or_path=/tmp/ckpt/... ...
    accelerate launch --config_file vlrl/accelerate_configs/fsdp.yaml bench/rehearsal_cli.py train ...

A checkpoint with random weights writes random tokens: no tags, no answer, so the preset's rewards are 0 for every
completion, every advantage is 0, GSPO's gradient is 0 and `vlrl train` rightly refuses the untrained adapter. Here
the correctness reward also pays the share of a completion's characters that are ASCII letters (0 to 1), which differs
between random completions of one prompt: the steps then train the LoRA weights for real (non-zero gradients, Adam
updates, a non-zero adapter to save and verify), at the same cost per step as the preset's own rewards. Episode runs
(the Crafter presets) get the same through each environment's step reward: a reply's share of ASCII letters.

With VLRL_STAGES=FILE, each stage `vlrl run` announces (its "=== 1/6 model ..." banners) is timed, with the CUDA
allocator's peak allocated and reserved memory within it, and FILE gets them as JSON as each stage ends.

With VLRL_SKIP_EVALS=1, `vlrl run` leaves out its two evals (and so the comparison and the report): every other stage
as a user runs it, for a rerun of a preset whose evals an earlier rehearsal measured (a 16-turn Crafter eval batch
takes minutes of the device's time). With VLRL_SKIP_EVALS=after it runs the baseline eval and leaves out the second.

With VLRL_FLEX_ROWS=N, decoding steps of at most N rows attend through FlexAttention (`attention.FLEX_ROWS`, issue 50).
With VLRL_CAP_CONTEXT_GIB=G (processes sharing one GPU, bench/capped.sh), `[model] memory_cap_gib` counts this process's
own CUDA context as G GiB (measured alone) instead of everything else on the card (`gpu_gspo.count_own_context`).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_gspo import count_own_context

from vlrl import run as run_stages
from vlrl.cli import main
from vlrl.envs import ENVIRONMENTS
from vlrl.grammar import rewards


def _text(completion) -> str:
    return completion if isinstance(completion, str) else str(completion[-1].get("content", ""))


def letter_share(text: str) -> float:
    """The share of ASCII letters in `text` (0 to 1): what random completions of one prompt differ in."""
    return sum(ch.isascii() and ch.isalpha() for ch in text) / max(1, len(text))


def with_letter_share(correctness):
    """`correctness` plus the share of ASCII letters in each completion (a skipped correctness counts 0)."""

    @functools.wraps(correctness)
    def reward(completions, answer, **kwargs):
        scores = correctness(completions, answer, **kwargs)
        return [(score or 0.0) + letter_share(_text(c)) for score, c in zip(scores, completions)]

    return reward


def with_reply_letter_share(step):
    """An environment's `step` whose reward also pays the reply's share of ASCII letters: an episode run (the Crafter
    presets) whose random replies name no valid action then still has returns that differ within a group."""

    @functools.wraps(step)
    def wrapped(self, reply: str):
        result = step(self, reply)
        result.reward += letter_share(reply)
        return result

    return wrapped


_preset_rewards = rewards.reward_funcs
rewards.reward_funcs = lambda symbolic=False: [f if i == 0 else with_letter_share(f)
                                                for i, f in enumerate(_preset_rewards(symbolic))]
for _spec in ENVIRONMENTS.values():  # "module:Class"; no module imports its game (crafter) before a reset
    _module, _name = _spec.split(":")
    _env = getattr(importlib.import_module(_module), _name)
    _env.step = with_reply_letter_share(_env.step)



class StageClock:
    """Wall time and peak CUDA memory of each stage between `vlrl.run.banner` calls, written to `path` as each stage
    ends (a run cut by its time limit keeps the stages it finished) and at exit."""

    def __init__(self, path: str):
        self.path, self.stages, self.current, self.started = path, [], None, time.time()
        self.banner = run_stages.banner
        run_stages.banner = self.mark
        atexit.register(self.close)

    def mark(self, text: str, log=print) -> None:
        self.close(final=False)
        self.current = (text, time.time())
        self.banner(text, log)

    def close(self, final: bool = True) -> None:
        import torch

        if self.current is not None:
            text, started = self.current
            stage = {"stage": text, "seconds": round(time.time() - started, 2)}
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                stage.update(peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                             peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2))
                torch.cuda.reset_peak_memory_stats()
            self.stages.append(stage)
            self.current = None
        if self.stages or final:
            Path(self.path).write_text(json.dumps({"stages": self.stages, "pid": os.getpid(),
                                                   "process_s": round(time.time() - self.started, 2)}, indent=2))


def skip_evals(keep_first: bool = False) -> None:
    """The two evals of `vlrl run` (single-turn and episode runs), its comparison and its report, left out, said;
    with `keep_first`, the baseline eval runs and only the one after training is left out."""
    from vlrl import report
    from vlrl.evaluation import compare

    evaluate = run_stages.evaluate_policy

    def skipped(*args, **kwargs):
        if keep_first and kwargs.get("when", args[5] if len(args) > 5 else None) == "before":
            return evaluate(*args, **kwargs)
        print(f"eval: skipped (VLRL_SKIP_EVALS={'after' if keep_first else 1})")
        return []

    run_stages.evaluate_policy = skipped  # the eval stage of single-turn and episode runs alike
    run_stages.compare_run = lambda *args, **kwargs: {}
    compare.summary = lambda *args, **kwargs: "comparison: skipped (VLRL_SKIP_EVALS=1)"  # episode runs' too
    report.render = lambda *args, **kwargs: None


if os.environ.get("VLRL_STAGES"):
    StageClock(os.environ["VLRL_STAGES"])
if os.environ.get("VLRL_SKIP_EVALS") in ("1", "after"):
    skip_evals(keep_first=os.environ["VLRL_SKIP_EVALS"] == "after")
if os.environ.get("VLRL_FLEX_ROWS"):
    from vlrl.engine import attention

    attention.FLEX_ROWS = int(os.environ["VLRL_FLEX_ROWS"])
count_own_context()

if __name__ == "__main__":
    sys.exit(main())
