"""Writes a benchmark's results: OUTPUT.json (all numbers) and OUTPUT.md (the table) beside each other; and packs a
run directory's small files into one results file (`pack`), leaving out what a rerun makes again at full size (eval
and sample records, report.html, plots, gzipped logs), so bench/results/ keeps numbers, not copies of runs.
With --key NAME the run joins a file of runs as its entry NAME, the others kept, so a set of runs stays one file:

    python bench/results_io.py pack runs/r2b bench/results/rehearsal_runs.json --key r2b
"""

import argparse
import json
import sys
from pathlib import Path

LEFT_OUT = (".html", ".png", ".gz")
WEIGHTS = {"checkpoints", "adapter", "merged16", "merged4", "gguf", "eval_images", "sft"}  # folders of weights and images


def write_results(result: dict, output: str | Path, markdown) -> None:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def kept(relative: str) -> bool:
    """Whether a run directory's file goes into its packed results: not records, pages, pictures or archives."""
    name = relative.rsplit("/", 1)[-1]
    return not relative.endswith(LEFT_OUT) and not (name.startswith(("eval_", "samples_")) and name.endswith(".jsonl"))


def pack(run_dir: str | Path, output: str | Path, key: str | None = None) -> dict:
    """One JSON object keyed by each kept file's path in `run_dir`: JSON parsed, JSON lines a list, text as text.

    With `key`, `output` is a file of runs: the packed object replaces (or joins) the entry `key`, the rest kept.
    """
    run_dir, packed = Path(run_dir), {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(run_dir).as_posix()
        if relative.split("/")[0] in WEIGHTS or not kept(relative):
            continue
        text = path.read_text(errors="replace")
        packed[relative] = (json.loads(text) if relative.endswith(".json") else
                            [json.loads(line) for line in text.splitlines() if line.strip()]
                            if relative.endswith(".jsonl") else text)
    runs = {**runs_in(output), key: packed} if key else packed
    Path(output).write_text(json.dumps(runs, indent=1, ensure_ascii=False) + "\n")
    return packed


def runs_in(output: str | Path) -> dict:
    """The runs already in `output`, none if it does not exist; ValueError or TypeError if it holds no JSON object."""
    if not Path(output).exists():
        return {}
    try:
        runs = json.loads(Path(output).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{output} is not JSON ({error}); --key adds to an object keyed by run name") from None
    if not isinstance(runs, dict):
        raise TypeError(f"{output} holds a JSON {type(runs).__name__}, not an object keyed by run name")
    return runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Pack a run directory's small files into one results file.")
    parser.add_argument("command", choices=["pack"])
    parser.add_argument("run_dir", help="the run directory")
    parser.add_argument("output", help="OUTPUT.json")
    parser.add_argument("--key", help="add the run to OUTPUT.json, a file of runs, as this entry; the others kept")
    args = parser.parse_args()
    if not Path(args.run_dir).is_dir():
        sys.exit(f"{args.run_dir} is not a directory: pack reads a run directory")
    try:
        packed = pack(args.run_dir, args.output, args.key)
    except (ValueError, TypeError) as error:
        sys.exit(f"{error}; give another OUTPUT.json")
    print(f"{args.output}{f' key {args.key}' if args.key else ''}: {len(packed)} files packed")
