"""Writes a benchmark's results beside each other: OUTPUT.json (all numbers) and OUTPUT.md (the table), and prints it."""

import json
from pathlib import Path


def write_results(result: dict, output: str | Path, markdown) -> None:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
