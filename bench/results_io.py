"""Writes a benchmark's results: OUTPUT.json (all numbers) and OUTPUT.md (the table) beside each other; and packs a
run directory's small files into one results file (`pack`), leaving out what a rerun makes again at full size (eval
and sample records, report.html, plots, gzipped logs), so bench/results/ keeps numbers, not copies of runs.

    python bench/results_io.py pack runs/r2b bench/results/rehearsal/r2b.json
"""

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


def pack(run_dir: str | Path, output: str | Path) -> dict:
    """One JSON object keyed by each kept file's path in `run_dir`: JSON parsed, JSON lines a list, text as text."""
    run_dir, packed = Path(run_dir), {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(run_dir).as_posix()
        if relative.split("/")[0] in WEIGHTS or not kept(relative):
            continue
        text = path.read_text(errors="replace")
        packed[relative] = (json.loads(text) if relative.endswith(".json") else
                            [json.loads(line) for line in text.splitlines() if line.strip()]
                            if relative.endswith(".jsonl") else text)
    Path(output).write_text(json.dumps(packed, indent=1, ensure_ascii=False) + "\n")
    return packed


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "pack":
        sys.exit("usage: python bench/results_io.py pack RUN_DIR OUTPUT.json")
    print(f"{sys.argv[3]}: {len(pack(sys.argv[2], sys.argv[3]))} files packed")
