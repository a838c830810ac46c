"""The Jupyter walkthrough (notebooks/vlrl_walkthrough.ipynb) run top to bottom by nbclient on a GPU, its preset
chosen by the parameters cell alone (injected the papermill way, as tests/walkthrough.py does on CPU): with
`--preset tiny-gpu`, every stage on the Unsloth backend (issue 46). Writes the executed notebook, each cell's time
and the run directory's comparison and adapter check to --out.

    python bench/gpu_walkthrough.py --preset tiny-gpu --run-dir /tmp/walkthrough --out $OUT/walkthrough
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "vlrl_walkthrough.ipynb"


def parameterized(preset: str, run_dir: str):
    """The notebook with a cell after its `parameters` cell that sets `preset` and `run_dir` (papermill's way)."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    cell = nbformat.v4.new_code_cell(f"preset = {preset!r}\nrun_dir = {run_dir!r}")
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)
    return nb


def main() -> None:
    import nbformat
    from nbclient import NotebookClient

    out = Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    nb = parameterized(ARGS.preset, ARGS.run_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["JUPYTER_DATA_DIR"] = str(out / "jupyter")  # the native python3 kernel: this interpreter
    started, error = time.time(), None
    try:
        NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    except Exception as err:  # noqa: BLE001 - a failing cell is the result; the executed notebook shows which
        error = f"{type(err).__name__}: {str(err)[-2000:]}"
    nbformat.write(nb, out / f"walkthrough-{ARGS.preset}.ipynb")
    run_dir = Path(ARGS.run_dir)
    read = lambda name: json.loads((run_dir / name).read_text()) if (run_dir / name).exists() else None
    result = {"preset": ARGS.preset, "ok": error is None, "error": error, "seconds": round(time.time() - started, 1),
              "cells_run": sum(1 for c in nb.cells if c.cell_type == "code" and c.get("execution_count")),
              "code_cells": sum(1 for c in nb.cells if c.cell_type == "code"),
              "comparison": read("comparison.json"), "files": sorted(p.name for p in run_dir.glob("*"))}
    (out / f"walkthrough-{ARGS.preset}.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "comparison"}, default=str), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny-gpu")
    p.add_argument("--run-dir", default="/tmp/walkthrough")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/walkthrough")
    ARGS = p.parse_args()
    main()
