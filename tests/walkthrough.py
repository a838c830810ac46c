"""Runs the Jupyter walkthrough (notebooks/vlrl_walkthrough.ipynb) top to bottom with nbclient, its parameters
injected the papermill way. tests/conftest.py's `walkthrough` fixture runs it once per session on the tiny preset: the
session's shared tiny run (`tiny_run`) is that run's directory, and tests/test_notebook.py checks its cells."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "vlrl_walkthrough.ipynb"


def execute(run_dir: Path, work: Path, name: str):
    """The walkthrough run by nbclient on the tiny preset into `run_dir`; the executed copy saved as work/<name>."""
    from nbclient import NotebookClient
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = parameterize_notebook(load_notebook_node(str(NOTEBOOK)), {"preset": "tiny", "run_dir": str(run_dir)})
    # The kernel is this interpreter (jupyter_client runs the python3 kernel spec's "python" as sys.executable; an
    # empty JUPYTER_DATA_DIR keeps a user's own python3 spec out) and imports this checkout's vlrl; VLRL_CACHE
    # (conftest) points it at the cached warm tiny model.
    root = str(NOTEBOOK.parent.parent)
    started = time.time()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        patch.setenv("JUPYTER_DATA_DIR", str(work / "jupyter"))
        client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(work)}})
        client.execute()
    print(f"walkthrough executed in {time.time() - started:.0f} s")
    nbformat.write(nb, work / name)  # for a person to open when a check fails
    return nb
