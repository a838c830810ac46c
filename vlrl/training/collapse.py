"""The collapse monitor: notices when a run's policy has collapsed onto one behaviour, so nothing is left to learn.

A GSPO group teaches only when its rewards differ. A policy that samples the same completion (or, in an episode
run, the same actions) for every draw makes every group flat, and training goes on to `max_steps` learning nothing:
the grid demonstration under training seed 0 did so from step 4 (bench/results/episodes.md). Each step logs

- `collapse/entropy`: the policy's mean token entropy (TRL's `entropy`, nats a token; absent where not measured),
- `collapse/distinct_share`: distinct completions (single-turn) or distinct action sequences (episodes) / all of them,
- `collapse/flat_share`: the share of groups whose rewards are all equal (TRL's `frac_reward_zero_std`),

and a step counts as collapsed when `flat_share >= FLAT_SHARE` and either `distinct_share <= DISTINCT_SHARE` or
`entropy <= ENTROPY`. After `PATIENCE` collapsed steps in a row the run prints one line saying what collapsed and
since which step, and `train_log.jsonl` records `collapse/since_step`; the report marks it. With `[training]
stop_on_collapse = true` the run stops there and its checkpoint of the collapsed policy is not written: the last
checkpoint before the collapse is the one the run goes on from (`vlrl.training.train`).
"""

from __future__ import annotations

import functools

from transformers import TrainerCallback

from vlrl.base import distributed
from vlrl.training.callbacks import Counting

FLAT_SHARE = 0.9  # at least this share of the step's groups flat: almost nothing to learn from
DISTINCT_SHARE = 0.25  # at most this share of its samples distinct: the draws repeat each other
ENTROPY = 0.05  # nats a token: the policy samples all but one token with near-zero probability
PATIENCE = 3  # collapsed steps in a row before the run says so (one flat step happens on a hard batch)


def is_collapsed(flat_share: float | None, distinct_share: float | None, entropy: float | None) -> bool:
    """Whether one step's numbers say collapsed (the rule above); a number not measured counts as not collapsed.

    >>> is_collapsed(1.0, 0.125, 0.4), is_collapsed(1.0, 0.9, 0.01), is_collapsed(0.5, 0.1, 0.01)
    (True, True, False)
    """
    if flat_share is None or flat_share < FLAT_SHARE:
        return False
    return (distinct_share is not None and distinct_share <= DISTINCT_SHARE) or (entropy is not None
                                                                                  and entropy <= ENTROPY)


def sample_key(sample) -> str:
    """What makes two samples the same: a completion's text (TRL passes strings, or `[{"role", "content"}]`), or an
    episode's action sequence (a tuple)."""
    if isinstance(sample, list) and sample and isinstance(sample[-1], dict):
        return str(sample[-1].get("content", ""))
    return str(sample)


class CollapseMonitor(Counting, TrainerCallback):
    """Logs each step's entropy, distinct share and flat share, says when the policy has collapsed, and with
    `stop` stops the run there.

    >>> monitor = CollapseMonitor(log=print)
    >>> monitor.observe(["<SOLUTION>4</SOLUTION>"] * 7 + ["<SOLUTION>5</SOLUTION>"])
    >>> monitor.step_numbers({"frac_reward_zero_std": 1.0, "entropy": 0.3})
    {'collapse/entropy': 0.3, 'collapse/distinct_share': 0.25, 'collapse/flat_share': 1.0, 'collapse/collapsed': 1}
    """

    def __init__(self, stop: bool = False, log=print):
        self.stop = stop
        self.log = log
        self.samples: list[str] = []
        self.run_length = 0  # collapsed steps in a row so far
        self.since_step = None  # the first step of the run of collapsed steps that was reported
        self.stopped_at_step = None

    def observe(self, samples) -> None:
        """The step's samples: completions, or episodes' action sequences."""
        if self.counting:
            self.samples.extend(sample_key(s) for s in samples)

    def watch(self, reward_func):
        """`reward_func`, unchanged, that also shows its completions to this monitor."""
        @functools.wraps(reward_func)
        def watched(completions, **kwargs):
            self.observe(completions)
            return reward_func(completions, **kwargs)

        return watched

    def step_numbers(self, logs: dict) -> dict:
        """This step's collapse numbers from the trainer's logs and the samples seen (summed over processes)."""
        distinct, seen = distributed.all_sum([float(len(set(self.samples))), float(len(self.samples))])
        self.samples = []
        numbers = {"collapse/entropy": logs.get("entropy"),
                   "collapse/distinct_share": distinct / seen if seen else None,
                   "collapse/flat_share": logs.get("frac_reward_zero_std")}
        numbers["collapse/collapsed"] = int(is_collapsed(numbers["collapse/flat_share"],
                                                         numbers["collapse/distinct_share"],
                                                         numbers["collapse/entropy"]))
        return {k: v for k, v in numbers.items() if v is not None}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "frac_reward_zero_std" not in logs:
            return  # not a training step's log (the end-of-training summary)
        numbers = self.step_numbers(logs)
        logs.update(numbers)
        self.run_length = self.run_length + 1 if numbers["collapse/collapsed"] else 0
        if self.run_length < PATIENCE or self.since_step is not None:
            return
        self.since_step = state.global_step - PATIENCE + 1
        logs["collapse/since_step"] = self.since_step
        what = ", ".join(f"{name} {numbers[f'collapse/{key}']:{fmt}}" for name, key, fmt in (
            ("entropy", "entropy", ".3g"), ("distinct", "distinct_share", ".0%"), ("flat groups", "flat_share", ".0%"))
            if f"collapse/{key}" in numbers)
        action = "stopping here" if self.stop else "training goes on ([training] stop_on_collapse = true stops it)"
        self.log(f"collapse: the policy has collapsed since step {self.since_step} ({what} for {PATIENCE} steps "
                 f"in a row): its groups are flat, so nothing is left to learn; {action}")
        if self.stop:
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
            control.should_save = False  # the collapsed policy is not kept as a checkpoint
