"""Trainer callbacks: every logged metric appended to train_log.jsonl as it comes, the degeneration monitor, and one
readable line per training step (`StepLine`) in place of TRL's dict of every metric.

Both work with TRL's GRPOTrainer and Unsloth's patched one: the monitor sees completions through the reward functions
(`DegenerationMonitor.watch`), not through either trainer's internals.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from pathlib import Path

from transformers import TrainerCallback

from vlrl.base import distributed
from vlrl.base.progress import duration, eta
from vlrl.grammar import rewards


class JsonlLogger(TrainerCallback):
    """Appends each logged metrics dict (with its step) to a JSONL file, flushed at once so nothing is lost. Under
    several processes the main one writes it: every process logs the same (gathered) metrics."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        record = {"step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


class Counting:
    """A callback that counts completions as the reward functions see them, and can stop counting for a while:
    dynamic sampling's redraws are left out of every logged number of the step's samples, which describe its first
    draw (`vlrl.training.dynamic_sampling`)."""

    counting = True

    @contextlib.contextmanager
    def paused(self):
        """While inside, the completions scored are not counted."""
        self.counting = False
        try:
            yield
        finally:
            self.counting = True


class DegenerationMonitor(Counting, TrainerCallback):
    """Watches every completion the trainer scores and logs, each logging step:

    - `degeneration/rate`: the share of completions that are `addCriterion`/newline spam (`rewards.format_parts`),
    - `degeneration/mean_ratio`: their mean spam share (`rewards.degeneration_ratio`),
    - `degeneration/clipped_ratio`: the share cut off at max_completion_length (TRL's `completions/clipped_ratio`,
      or counted here from the completion lengths when the trainer does not report it).

    With `stop_at` > 0 it stops training (after saving a checkpoint) once `degeneration/rate` reaches `stop_at`.
    Under several processes each sees its own share of the completions; the counts are summed over the processes
    at each log, so every process logs the same numbers and stops at the same step.
    The completions reach it through `watch(reward_func)`, a pass-through wrapper: both TRL's and Unsloth's
    trainers hand every completion to the reward functions, so this needs nothing from either trainer's internals.

    >>> monitor = DegenerationMonitor()
    >>> watched = monitor.watch(rewards.format_reward)
    >>> watched.__name__, watched(["addCriterion\\naddCriterion", "<SOLUTION>4</SOLUTION>"])
    ('format_reward', [-2.0, 1.0])
    >>> monitor.summary()
    {'degeneration/rate': 0.5, 'degeneration/mean_ratio': 0.5}
    """

    def __init__(self, stop_at: float = 0.0, max_completion_length: int | None = None, log=print):
        self.stop_at = stop_at
        self.max_completion_length = max_completion_length
        self.log = log
        self.stopped_at_step = None
        self._reset()

    def _reset(self):
        self.seen = self.degenerate = self.lengths_seen = self.clipped = 0
        self.ratio_sum = 0.0

    def observe(self, completions, completion_ids=None) -> None:
        if not self.counting:
            return
        for completion in completions:
            parts = rewards.format_parts(completion)
            self.seen += 1
            self.degenerate += bool(parts["degenerate"])
            self.ratio_sum += parts["degeneration_ratio"]
        if completion_ids is not None and self.max_completion_length:
            self.lengths_seen += len(completion_ids)
            self.clipped += sum(len(ids) >= self.max_completion_length for ids in completion_ids)

    def watch(self, reward_func):
        """`reward_func`, unchanged (same name, same scores), that also shows its completions to this monitor."""
        @functools.wraps(reward_func)
        def watched(completions, **kwargs):
            self.observe(completions, kwargs.get("completion_ids"))
            return reward_func(completions, **kwargs)

        return watched

    def _sum_over_processes(self) -> None:
        counts = [self.seen, self.degenerate, self.lengths_seen, self.clipped, self.ratio_sum]
        self.seen, self.degenerate, self.lengths_seen, self.clipped, self.ratio_sum = distributed.all_sum(counts)

    def summary(self) -> dict:
        if not self.seen:
            return {}
        out = {"degeneration/rate": self.degenerate / self.seen, "degeneration/mean_ratio": self.ratio_sum / self.seen}
        if self.lengths_seen:
            out["degeneration/clipped_ratio"] = self.clipped / self.lengths_seen
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        self._sum_over_processes()  # every process logs at the same steps, so each takes part in the sum
        if not self.seen:
            return  # nothing generated since the last log (e.g. the end-of-training summary)
        summary = self.summary()
        if "completions/clipped_ratio" in logs:  # the trainer's own count (EOS-aware) wins over the length count
            summary["degeneration/clipped_ratio"] = logs["completions/clipped_ratio"]
        logs.update(summary)
        self._reset()
        if self.stop_at and summary["degeneration/rate"] >= self.stop_at:
            logs["degeneration/early_stop"] = 1
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
            control.should_save = True  # keep the state that degenerated, for inspection
            self.log(f"stopping at step {state.global_step}: {summary['degeneration/rate']:.0%} of the completions "
                     f"degenerated (>= [training] stop_on_degeneration = {self.stop_at})")


class StepLine(Counting, TrainerCallback):
    """One line per training step: reward (and its spread), accuracy, format, KL, step time and ETA. TRL's own
    progress callback prints each step's dict of every metric (1,265 characters); train_log.jsonl keeps those.

    The accuracy is the share of completions the correctness reward scored above 0, counted through
    `watch(correctness_reward)` (summed over the processes of a launch) and logged as `rewards/accuracy`.

    >>> line = StepLine(log=print)
    >>> watched = line.watch(rewards.correctness_reward)
    >>> watched(["<SOLUTION>4</SOLUTION>", "<SOLUTION>5</SOLUTION>"], answer=["4", "4"])
    [2.0, 0.0]
    >>> line.describe({"reward": 1.2, "reward_std": 0.4, "rewards/accuracy": 0.5}, step=2, total=8, seconds=6.0)
    'step 2/8: reward 1.20 (std 0.40), accuracy 50%, 3.0 s/step, ETA 18 s'
    """

    def __init__(self, log=print):
        self.log = log
        self.right = self.scored = 0
        self.started, self.first_step = None, 0  # the wall clock from the first step this process trains

    def watch(self, reward_func):
        """`reward_func` (the correctness reward), unchanged, its scores counted for the step's accuracy."""
        @functools.wraps(reward_func)
        def watched(completions, **kwargs):
            scores = reward_func(completions, **kwargs)
            if not self.counting:
                return scores
            scored = [s for s in scores if s is not None]  # None: an item without a usable gold, not scored
            self.right += sum(s > 0 for s in scored)
            self.scored += len(scored)
            return scores

        return watched

    def describe(self, logs: dict, step: int, total: int, seconds: float) -> str:
        """The step's line from its logged metrics, `seconds` after the first step this process trained began (the
        pace by the wall clock: TRL's step_time leaves out parts of a step)."""
        parts = [f"reward {logs['reward']:.2f}" + (f" (std {logs['reward_std']:.2f})" if "reward_std" in logs else "")]
        if "rewards/success/mean" in logs:  # an episode run: the share of episodes that succeeded
            parts.append(f"success {logs['rewards/success/mean']:.0%}")
        if "rewards/accuracy" in logs:
            parts.append(f"accuracy {logs['rewards/accuracy']:.0%}")
        if "rewards/format_reward/mean" in logs:
            parts.append(f"format {logs['rewards/format_reward/mean']:.2f}")
        if "kl" in logs:
            parts.append(f"KL {logs['kl']:.2g}")
        elif "sampling/rollout_train_kl" in logs:  # beta = 0 (the recipe): the rollout/training KL instead
            parts.append(f"rollout/train KL {logs['sampling/rollout_train_kl']:.2g}")
        if "rollout_time" in logs and logs.get("step_time"):  # where a step's time goes: generating, or the rest
            parts.append(f"rollouts {logs['rollout_time'] / logs['step_time']:.0%} of the step")
        if "rollout/decode_ms_per_step" in logs:  # the engine's decoding step, timed on the device
            parts.append(f"a decoding step {logs['rollout/decode_ms_per_step']:.1f} ms")
        done = step - self.first_step
        if done > 0:
            parts.append(f"{seconds / done:.1f} s/step")
            parts.append(eta(done, done + total - step, seconds))
        return f"step {step}/{total}: " + ", ".join(p for p in parts if p)

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.first_step = time.time(), state.global_step  # a resumed run starts past step 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        self.right, self.scored = distributed.all_sum([self.right, self.scored])  # every process logs each step
        if self.scored:
            logs["rewards/accuracy"] = self.right / self.scored
        self.right = self.scored = 0
        if "reward" in logs and state.is_world_process_zero:
            seconds = time.time() - (self.started or time.time())
            self.log(self.describe(logs, state.global_step, state.max_steps, seconds))
        elif "train_runtime" in logs and state.is_world_process_zero:  # the end-of-training summary
            self.log(f"training: {state.global_step} steps in {duration(logs['train_runtime'])}")


def quiet_progress(trainer) -> None:
    """Drops the trainer's progress bar and its printing of every metric dict: `StepLine` says each step in one line
    with its ETA (a bar redrawn between those lines broke them), and train_log.jsonl keeps every number."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.pop_callback(ProgressCallback)
    trainer.pop_callback(PrinterCallback)
