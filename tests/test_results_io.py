"""bench/results_io.py's `pack`: a run directory as one results file, or as one key of a file of runs (`--key`), and
the committed files of runs (bench/results/rehearsal_runs.json, engine_runs.json) holding every run the pages name."""

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

from results_io import pack


def run_dir(root: Path, name: str, steps: int) -> Path:
    """A run directory as `vlrl run` leaves it: the small files pack keeps; records, pages, weights it leaves out."""
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    (run / "config.toml").write_text(f'[training]\nmax_steps = {steps}\n')
    (run / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1 * s}) + "\n" for s in range(steps)))
    (run / "comparison.json").write_text(json.dumps({"before": 0.25, "after": 0.5}))
    (run / "eval_before.jsonl").write_text('{"id": "a", "correct": true}\n')
    (run / "report.html").write_text("<html></html>")
    return run


def pack_command(*args) -> subprocess.CompletedProcess:
    """`python bench/results_io.py pack ARGS` as a user types it."""
    return subprocess.run([sys.executable, str(ROOT / "bench" / "results_io.py"), "pack", *map(str, args)],
                          capture_output=True, text=True, check=False)


def test_key_adds_a_run_to_a_file_of_runs_and_keeps_the_others(tmp_path):
    runs = tmp_path / "runs.json"
    pack(run_dir(tmp_path, "r2b", 2), runs, key="r2b")
    pack(run_dir(tmp_path, "c2b", 3), runs, key="c2b")
    loaded = json.loads(runs.read_text())
    assert sorted(loaded) == ["c2b", "r2b"]
    assert sorted(loaded["r2b"]) == ["comparison.json", "config.toml", "train_log.jsonl"]  # no records, page, weights
    assert [row["step"] for row in loaded["c2b"]["train_log.jsonl"]] == [0, 1, 2]
    pack(run_dir(tmp_path / "again", "r2b", 4), runs, key="r2b")  # a rerun replaces its own entry only
    loaded = json.loads(runs.read_text())
    assert len(loaded["r2b"]["train_log.jsonl"]) == 4 and len(loaded["c2b"]["train_log.jsonl"]) == 3


def test_without_key_the_output_is_the_run_alone(tmp_path):
    (tmp_path / "r2b.json").write_text('{"old": 1}')
    packed = pack(run_dir(tmp_path, "r2b", 1), tmp_path / "r2b.json")
    assert json.loads((tmp_path / "r2b.json").read_text()) == packed and "old" not in packed


@pytest.mark.parametrize("output_text, words", [("[1, 2]", "holds a JSON list"), ("{not json", "is not JSON")])
def test_key_into_a_file_that_is_not_runs_is_one_line_and_writes_nothing(tmp_path, output_text, words):
    output = tmp_path / "runs.json"
    output.write_text(output_text)
    done = pack_command(run_dir(tmp_path, "r2b", 1), output, "--key", "r2b")
    assert done.returncode == 1 and words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and output.read_text() == output_text


def test_a_missing_run_directory_is_one_line(tmp_path):
    done = pack_command(tmp_path / "nothing", tmp_path / "runs.json", "--key", "x")
    assert done.returncode == 1 and "is not a directory" in done.stderr and not (tmp_path / "runs.json").exists()


def named_keys(text: str, file: str) -> list[str]:
    """The run names a page gives for `file`: "`file` key `a`" or "`file` keys `a`, `b`"."""
    names = []
    for listed in re.findall(rf"`(?:results/)?{re.escape(file)}`\s+keys?\s+((?:`[^`]+`(?:,\s+)?)+)", text):
        names += [name for name in re.findall(r"`([^`]+)`", listed) if not name.startswith("...")]
    return names


@pytest.mark.parametrize("file, pages", [
    ("rehearsal_runs.json", ["rehearsal.md", "../README.md"]),
    ("engine_runs.json", ["engine.md", "qwen35.md", "../README.md"]),
])
def test_every_run_a_page_names_is_in_its_file_of_runs(file, pages):
    runs = json.loads((RESULTS / file).read_text())
    named = [name for page in pages for name in named_keys((RESULTS / page).read_text(), file)]
    assert len(named) >= 5, f"the pages name {named} in {file}"
    assert [name for name in named if not fnmatch.filter(runs, name)] == []


def test_engine_json_raw_pointers_reach_their_rows():
    """engine.json's "raw" fields point into a file of runs (engine_runs.json, capped_runs.json) as FILE#RUN/KEY (a
    KEY ending in / names a folder)."""
    files = {name: json.loads((RESULTS / name).read_text()) for name in ("engine_runs.json", "capped_runs.json")}
    pointers = []
    for raw in re.findall(r'"raw": "([^"]*)"', (RESULTS / "engine.json").read_text()):
        pointers += [ref.split(" ")[0] for ref in raw.split(", ")]
    assert len(pointers) >= 10 and any(p.startswith("capped_runs.json#") for p in pointers)
    for pointer in pointers:
        file, _, path = pointer.partition("#")
        run, _, key = path.partition("/")
        assert file in files and run in files[file], pointer
        runs = files[file]
        assert not key or key in runs[run] or any(k.startswith(key) for k in runs[run]), pointer


def test_capped_23gib_is_what_its_runs_say():
    """engine.json's `capped_23gib` (bench/capped_results.py) agrees with the packed runs it reads: each run's preset,
    verdict (two GSPO steps, no out-of-memory error) and allocator peak; and the thinking preset's out-of-memory at its old eval batch stays said."""
    from capped_results import preset_row, process_peaks

    runs = json.loads((RESULTS / "capped_runs.json").read_text())
    capped = json.loads((RESULTS / "engine.json").read_text())["capped_23gib"]
    peaks = process_peaks(runs)
    rows = dict(preset_row(name, run, peaks, 23.0) for name, run in sorted(runs.items()) if "config.toml" in run)
    assert len(rows) >= 6
    for preset, row in rows.items():  # the latest run of each preset; an earlier one kept under "earlier"
        assert {k: v for k, v in capped["presets"][preset].items() if k != "earlier"} == row, preset
    thinking = capped["presets"]["qwen3-vl-8b-thinking-mathvista"]
    assert thinking["value"] is True and thinking["earlier"]["value"] is False  # eval batch 16 fits where 32 did not
    assert all(row["value"] is True for row in capped["presets"].values())  # every preset ran under the cap
    assert capped["presets"]["qwen3-vl-8b-mathvista"]["value"] is True
    assert all(r["max_reserved_gib"] <= 22 for r in capped["inputs"])
