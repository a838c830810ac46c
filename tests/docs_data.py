"""docs/data.md's code blocks as the tests run them: a section's text, a block of it by its first line, a script of
it run as a user would (`python make_pairs.py`), and its `[data]` table as a DataConfig."""

import re
import subprocess
import sys
from pathlib import Path

import tomllib

from vlrl.config.runfile import DataConfig

DATA_MD = Path(__file__).resolve().parent.parent / "docs" / "data.md"


def section(title: str) -> str:
    """The text of docs/data.md's `## title` section, up to the next section."""
    return DATA_MD.read_text().split(f"\n## {title}\n")[1].split("\n## ")[0]


def block(text: str, first_line: str) -> str:
    """The code block of `text` that starts with `first_line`."""
    match = re.search(r"```\w*\n(" + re.escape(first_line) + r".*?)```", text, re.DOTALL)
    assert match, first_line
    return match.group(1)


def run_script(text: str, first_line: str, folder: Path) -> None:
    """Runs the script block of `text` starting with `first_line` (`# make_x.py: ...`) in `folder`, as `python make_x.py`."""
    script = folder / first_line.split()[1].rstrip(":")
    script.write_text(block(text, first_line))
    subprocess.run([sys.executable, script.name], cwd=folder, check=True, capture_output=True)


def data_config(text: str, first_line: str, **changes) -> DataConfig:
    """The `[data]` table of the TOML block starting with `first_line`, with `changes`."""
    return DataConfig(**{**tomllib.loads(block(text, first_line))["data"], **changes})
