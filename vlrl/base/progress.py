"""How long: durations and ETAs in the words progress lines use (`duration`, `eta`), and `Progress`, a long stage's
progress as lines a log keeps (items done of all, elapsed, ETA), for stages a progress bar does not cover.

    >>> duration(42), duration(135), duration(7_530)
    ('42 s', '2 min 15 s', '2 h 5 min')
    >>> eta(done=3, total=8, seconds=30)
    'ETA 50 s'
"""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: "42 s", "2 min 15 s", "2 h 5 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def eta(done: int, total: int, seconds: float) -> str:
    """The time left for `total - done` more units at the pace of the first `done` ("ETA ..."; "" before any)."""
    if done <= 0 or total <= done:
        return "" if done <= 0 else "ETA 0 s"
    return f"ETA {duration(seconds / done * (total - done))}"


class Progress:
    """A long stage's progress as log lines: `update(n)` after each batch logs "<label>: done/total <unit>, elapsed,
    ETA". Nothing is logged when `log` is None or there is nothing to do.

    >>> lines = []
    >>> bar = Progress("eval eval_before.jsonl", total=4, unit="episodes", log=lines.append)
    >>> bar.update(2); lines[0].startswith("eval eval_before.jsonl: 2/4 episodes, ")
    True
    """

    def __init__(self, label: str, total: int, unit: str, log=None):
        self.label, self.total, self.unit, self.log = label, total, unit, log
        self.done = 0
        self.started = time.time()

    def update(self, n: int) -> None:
        self.done += n
        if self.log is None or not self.total:
            return
        elapsed = time.time() - self.started
        left = eta(self.done, self.total, elapsed)
        self.log(f"{self.label}: {self.done}/{self.total} {self.unit}, {duration(elapsed)}"
                 + (f", {left}" if self.done < self.total else ""))
