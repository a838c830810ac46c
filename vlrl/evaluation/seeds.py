"""One configuration trained under several training seeds: each run's before/after with its paired test, and the
pooled result, so a claim rests on the spread of seeds rather than on the one that worked.

    vlrl compare runs/grid-seed0 runs/grid-seed1 runs/grid-seed2 --output seeds.json

Each run directory's `eval_before.jsonl` and `eval_after.jsonl` go through `compare` (single-turn records: accuracy
and exact McNemar; episode records: success and exact McNemar). The runs must have evaluated the same held-out
items, so their rates are comparable. The pooled result counts the runs that gained significantly (p < 0.01,
`SIGNIFICANT`) and those that ended below their baseline, gives the median gain, the mean rates, and an exact sign
test over the runs' gains (are the seeds' gains more often up than down?).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from vlrl.base.errors import EvalError, RunDirError
from vlrl.base.stats import mcnemar_exact
from vlrl.config.rundir import RunDir
from vlrl.evaluation.compare import compare
from vlrl.evaluation.records import read_records

SIGNIFICANT = 0.01  # the bar a seed's paired p must pass to count as a significant gain


def compare_runs(run_dirs: list[str | Path], records: str = "eval") -> dict:
    """The per-run table and the pooled result of several runs of one configuration.

    Args:
        run_dirs: two or more run directories, each with eval_before.jsonl and eval_after.jsonl of the same items.
        records: "eval" (those files) or "samples" (samples_before/after.jsonl: each item's first seeded draw).

    Returns:
        A JSON-ready dict: `metric` ("accuracy" or "success"), `runs` (per run: `run`, `seed` (its `[training]
        seed`), `before`, `after`, `gain`, `p` (exact McNemar), `n_paired`, `significant`) and `pooled` (`runs`,
        `significant` (runs that gained with p < 0.01), `below_baseline`, `median_gain`, `mean_before`,
        `mean_after`, `sign_test_p`).

    Raises:
        EvalError: fewer than two runs, a run without its two eval files, or runs evaluated on different items.
    """
    if len(run_dirs) < 2:
        raise EvalError("give two or more run directories of one configuration (one per training seed).")
    rows, items, metric = [], None, None
    for path in run_dirs:
        run = RunDir.of(path)
        files = compared_files(run, records)
        try:
            run.require(*files, what="a comparison across seeds")
        except RunDirError as err:
            raise EvalError(str(err)) from None
        c = compare(*files)
        kind = "success" if c.get("kind") == "episodes" else "accuracy"
        if metric and kind != metric:
            raise EvalError(f"{run.path} holds {kind} records while the runs before it hold {metric} records; "
                            "compare runs of one configuration.")
        metric = kind
        paired = _paired_ids(*files)
        if items is not None and paired != items:
            raise EvalError(f"{run.path} evaluated other items than {rows[0]['run']} ({len(paired)} against "
                            f"{len(items)} paired ids); runs compared across seeds need the same held-out items.")
        items = paired
        before, after = c[f"{metric}_before"], c[f"{metric}_after"]
        rows.append({"run": str(run.path), "seed": run.config.training.seed if run.config_file.exists() else None,
                     "before": before, "after": after, "gain": after - before, "p": c["mcnemar_p"],
                     "n_paired": c["n_paired"], "significant": after > before and c["mcnemar_p"] < SIGNIFICANT})
    gains = [row["gain"] for row in rows]
    pooled = {"runs": len(rows), "significant": sum(row["significant"] for row in rows),
              "below_baseline": sum(gain < 0 for gain in gains), "median_gain": statistics.median(gains),
              "mean_before": statistics.fmean(row["before"] for row in rows),
              "mean_after": statistics.fmean(row["after"] for row in rows),
              "sign_test_p": mcnemar_exact(sum(g > 0 for g in gains), sum(g < 0 for g in gains))}
    return {"metric": metric, "runs": rows, "pooled": pooled}


def compared_files(run: RunDir, records: str = "eval") -> tuple[Path, Path]:
    """A run's before and after records of one kind: "eval" (eval_before/after.jsonl) or "samples"
    (samples_before/after.jsonl, `[eval] samples`)."""
    if records == "eval":
        return run.eval_before, run.eval_after
    return run.path / "samples_before.jsonl", run.path / "samples_after.jsonl"


def _paired_ids(before: Path, after: Path) -> frozenset:
    """The item ids a run's two evals share."""
    ids = [{record.get("id") for record in read_records(path)} for path in (before, after)]
    return frozenset(ids[0] & ids[1])


def summary(result: dict) -> str:
    """The per-run table and the pooled line, as a person reads them.

    >>> result = {"metric": "success", "runs": [
    ...     {"run": "runs/s0", "seed": 0, "before": 0.06, "after": 0.0, "gain": -0.06, "p": 0.5, "n_paired": 16,
    ...      "significant": False},
    ...     {"run": "runs/s1", "seed": 1, "before": 0.06, "after": 0.44, "gain": 0.38, "p": 0.008, "n_paired": 16,
    ...      "significant": True}],
    ...     "pooled": {"runs": 2, "significant": 1, "below_baseline": 1, "median_gain": 0.16, "mean_before": 0.06,
    ...                "mean_after": 0.22, "sign_test_p": 1.0}}
    >>> print(summary(result))
    run      seed  success before  after    gain    paired p  items
    runs/s0  0     6.0%            0.0%     -6.0%   0.5       16
    runs/s1  1     6.0%            44.0%    +38.0%  0.008     16  significant
    1 of 2 runs gained significantly (p < 0.01), 1 ended below its baseline; median gain +16.0%; mean 6.0% -> 22.0%; sign test over the runs p = 1
    """
    width = max(len(row["run"]) for row in result["runs"]) + 2
    lines = [f"{'run':<{width}}seed  {result['metric'] + ' before':<16}{'after':<9}{'gain':<8}{'paired p':<10}items"]
    for row in result["runs"]:
        lines.append(f"{row['run']:<{width}}{row['seed']!s:<6}{row['before']:<16.1%}{row['after']:<9.1%}"
                     f"{row['gain']:<+8.1%}{row['p']:<10.3g}{row['n_paired']}"
                     + ("  significant" if row["significant"] else ""))
    p = result["pooled"]
    lines.append(f"{p['significant']} of {p['runs']} runs gained significantly (p < {SIGNIFICANT:g}), "
                 f"{p['below_baseline']} ended below its baseline; median gain {p['median_gain']:+.1%}; "
                 f"mean {p['mean_before']:.1%} -> {p['mean_after']:.1%}; sign test over the runs "
                 f"p = {p['sign_test_p']:.3g}")
    return "\n".join(lines)
