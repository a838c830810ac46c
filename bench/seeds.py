"""Commits one demonstration's runs under several training seeds (issue 49): each run's eval records, slimmed, under
bench/results/seeds/DEMO/ (`after-S.jsonl` per training seed; one `before.jsonl` when every run's baseline records are
the same, as they are when the runs share the model, warm start and held-out set, else `before-S.jsonl`), each run's
small files packed under its seed in runs.json beside them with the pooled comparison of `vlrl compare RUN_DIR...`
(key "compare"), its entries in bench/results/seeds.json (the paths, the figures recomputed from the committed
records); prints the per-seed table for seeds.md.

    python bench/seeds.py grid runs/grid-0 runs/grid-1 runs/grid-2 runs/grid-3 runs/grid-4 \\
        --command "vlrl run --config bench/learning/grid-200.toml --set training.seed={seed} --run-dir runs/grid-{seed}"

A slimmed record keeps every per-episode field `vlrl compare` reads (`id`, `seed`, `success`, `return`, `length`,
`status`, invalid actions, dropped images) and each turn's actions, reward and validity; it leaves out the reply text
and the frames' file names, which a rerun writes again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from results_io import pack  # bench/ is on sys.path when run as a script

from vlrl.config.rundir import RunDir
from vlrl.evaluation.compare import compare
from vlrl.evaluation.records import read_records
from vlrl.evaluation.seeds import compare_runs, compared_files, summary

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TURN_KEPT = ("actions", "reward", "invalid", "problem")


def slim(record: dict) -> dict:
    """An episode record without its reply texts and frame names; a single-turn record as it is."""
    if record.get("kind") != "episode":
        return record
    kept = {k: v for k, v in record.items() if k not in ("frames", "turns")}
    kept["turns"] = [{k: turn[k] for k in TURN_KEPT if k in turn} for turn in record["turns"]]
    return kept


def figures(before: Path, after: Path) -> dict:
    """A seed's figures, from its committed records."""
    c = compare(read_records(before), read_records(after))
    metric = "success" if c.get("kind") == "episodes" else "accuracy"
    table = c["table"]
    gained, lost = (table["failure_to_success"], table["success_to_failure"]) if metric == "success" else \
        (table["wrong_to_right"], table["right_to_wrong"])
    row = {"metric": metric, "n_paired": c["n_paired"], "before_rate": c[f"{metric}_before"],
           "after_rate": c[f"{metric}_after"], "gained": gained, "lost": lost, "mcnemar_p": c["mcnemar_p"]}
    if metric == "success":
        row.update(return_before=c["return_mean_before"], return_after=c["return_mean_after"],
                   return_permutation_p=c["return_permutation_p"])
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("demo", help="the demonstration's name in seeds.json (grid, crafter, offbyone, ...)")
    parser.add_argument("runs", nargs="+", help="run directories of one configuration, one per training seed")
    parser.add_argument("--command", required=True, help="the command of one run, {seed} for its training seed")
    parser.add_argument("--records", choices=("eval", "samples"), default="eval",
                        help="which evals to commit and compare: eval_* (greedy, or an episode run's) or samples_* "
                             "(seeded draws at temperature: the first draw per item is compared, as `vlrl compare`)")
    args = parser.parse_args(argv)
    out, entries, packed = RESULTS / "seeds" / args.demo, [], {}
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted((RunDir.of(path) for path in args.runs), key=lambda run: run.config.training.seed)
    slimmed = {run.config.training.seed: {side: "".join(json.dumps(slim(r), separators=(",", ":")) + "\n"
                                                       for r in read_records(records))
                                          for side, records in zip(("before", "after"),
                                                                   compared_files(run, args.records))}
               for run in runs}
    shared = len({text["before"] for text in slimmed.values()}) == 1
    for run in runs:
        seed = run.config.training.seed
        before = out / ("before.jsonl" if shared else f"before-{seed}.jsonl")
        after = out / f"after-{seed}.jsonl"
        before.write_text(slimmed[seed]["before"])
        after.write_text(slimmed[seed]["after"])
        log = Path(f"{run.path}.log")  # the run's own output, where the runs' script put it
        if log.exists():
            shutil.copy(log, run.path / "run.log")
        with tempfile.TemporaryDirectory() as scratch:
            packed[f"seed-{seed}"] = pack(run.path, Path(scratch) / "run.json")
        entries.append({"demo": args.demo, "seed": seed, "before": before.relative_to(ROOT).as_posix(),
                        "after": after.relative_to(ROOT).as_posix(), "run": (out / "runs.json").relative_to(ROOT)
                        .as_posix(), "run_key": f"seed-{seed}", **figures(before, after),
                        **({"records": "samples: the first seeded draw an item"} if args.records == "samples" else {}),
                        "command": args.command.format(seed=seed)})
    pooled = compare_runs(args.runs, records=args.records)
    (out / "runs.json").write_text(json.dumps({**packed, "compare": pooled}, indent=1, ensure_ascii=False) + "\n")
    index = RESULTS / "seeds.json"
    kept = [e for e in json.loads(index.read_text()) if e["demo"] != args.demo] if index.exists() else []
    index.write_text(json.dumps(kept + sorted(entries, key=lambda e: e["seed"]), indent=1) + "\n")
    episodes = entries[0]["metric"] == "success"
    print(f"| training seed | {entries[0]['metric']} before -> after (paired) | gained / lost | McNemar p |"
          + (" mean return | return permutation p |\n|---|---|---|---|---|---|" if episodes else "\n|---|---|---|---|"))
    for e in sorted(entries, key=lambda e: e["seed"]):
        row = (f"| {e['seed']} | {e['before_rate']:.1%} -> {e['after_rate']:.1%} ({e['n_paired']}) | {e['gained']} / "
               f"{e['lost']} | {e['mcnemar_p']:.2g} |")
        if episodes:
            row += f" {e['return_before']:.2f} -> {e['return_after']:.2f} | {e['return_permutation_p']:.2g} |"
        print(row)
    print(summary(pooled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
