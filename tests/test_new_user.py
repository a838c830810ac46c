"""A new user in a fresh clone (issue 47, point 11): a data line that is not UTF-8 is a counted skip, a mistyped model
fails at once (in `vlrl validate` too) without the hub's retries, a run directory that is a file and sft's bad
numbers are one line before anything loads, an empty run file says what it runs, and the README says what the tests
install."""

import json
import time
from pathlib import Path

import pytest
from test_cli import _one_line_error

from vlrl.cli import main

ROOT = Path(__file__).resolve().parent.parent


# --- a line that is not UTF-8 ------------------------------------------------------------------------------------------

@pytest.fixture
def latin1_data(tmp_path) -> Path:
    """A train.jsonl of 11 records, the 10th written in Latin-1 (a byte that is not UTF-8), and its picture."""
    from test_data import png

    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "1.png").write_bytes(png())
    lines = [json.dumps({"pid": str(i), "question": f"How many bars are there? ({i})", "answer": str(i),
                         "image": "images/1.png"}).encode() for i in range(10)]
    lines.insert(9, '{"pid": "café", "question": "Combien?", "answer": "2", "image": "images/1.png"}'.encode("latin-1"))
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return tmp_path / "train.jsonl"


def test_a_line_that_is_not_utf8_is_a_counted_skip_naming_the_line(latin1_data, capsys):
    from vlrl import data

    ds, report = data.load_mathvista(str(latin1_data), split="train", image_size=16, return_report=True)
    assert len(ds) == 10 and report.skipped == {"invalid_record": 1}
    assert "line 10: not UTF-8 (byte 0xe9 at column 13); save the file as UTF-8" in report.examples["invalid_record"][0]

    assert main(["data", "inspect", str(latin1_data), "--split", "train"]) == 0
    out = capsys.readouterr().out
    assert "kept 10 of 11 rows; skipped 1 (invalid_record 1)" in out and "line 10: not UTF-8" in out

    run_file = latin1_data.parent / "run.toml"
    run_file.write_text(f'name = "mine"\n[data]\nsource = "{latin1_data}"\nsplit = "train"\nhold_out = 2\n')
    assert main(["validate", str(run_file)]) == 0  # line 10 is past the 8 rows validate converts: found by its scan
    out = capsys.readouterr().out
    assert "1 line(s) of train.jsonl not UTF-8, `vlrl run` skips them as invalid_record: line 10" in out
    assert "save the file as UTF-8" in out


def test_a_json_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "train.json").write_bytes('[{"question": "Combien?", "answer": "2", "pid": "é"}]'.encode("latin-1"))
    assert main(["data", "inspect", str(tmp_path / "train.json")]) == 1
    assert "is not UTF-8 (byte 0xe9 on line 1); save it as UTF-8" in _one_line_error(capsys, "data")


# --- a mistyped model --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,words", [
    ("nosuchmodel", ["name_or_path = 'nosuchmodel' is not a model vlrl builds", "warm_start_steps = 150 only applies"]),
    ("tinyy", ["name_or_path = 'tinyy' is not a model vlrl builds", "Did you mean 'tiny'?"]),
])
def test_a_mistyped_model_on_a_warm_started_preset_names_the_model_first(name, words, capsys):
    assert main(["validate", "tiny", "--set", f"model.name_or_path={name}"]) == 1
    line = _one_line_error(capsys, "validate")
    assert all(word in line for word in words), line


@pytest.mark.parametrize("name,words", [
    ("nosuchmodel", ["no directory 'nosuchmodel' here, and it is not a hub id (owner/name)"]),
    ("./nosuch/model", ["no directory './nosuch/model' here", "a local checkpoint directory"]),
    ("nosuch/model", ["'nosuch/model' is not in the local hub cache", "HF_HUB_OFFLINE"]),
])
def test_validate_refuses_a_model_that_is_neither_here_nor_on_a_reachable_hub(name, words, capsys, monkeypatch):
    """The tests run with no hub: a well-formed hub id is asked once (no retries) and refused in a few seconds."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    started = time.monotonic()
    assert main(["validate", "tiny", "--set", f"model.name_or_path={name}", "--set", "model.warm_start_steps=0"]) == 1
    assert time.monotonic() - started < 15
    line = _one_line_error(capsys, "validate")
    assert all(word in line for word in words), line


def test_offline_mode_refuses_an_uncached_hub_model_before_any_request(monkeypatch, capsys):
    import urllib.request

    from vlrl.model.source import model_source_problem

    def no_request(*args, **kwargs):
        raise AssertionError("the hub was asked although HF_HUB_OFFLINE is set")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(urllib.request, "urlopen", no_request)
    assert "HF_HUB_OFFLINE is set" in model_source_problem("nosuch/model")
    assert model_source_problem(str(ROOT / "data")) is None  # a local directory: its contents are the loader's


def test_a_run_with_a_model_nowhere_fails_at_once_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    started = time.monotonic()
    assert main(["run", "--preset", "tiny", "--run-dir", str(tmp_path / "run"), "--set", "model.name_or_path=nosuch/model",
                 "--set", "model.warm_start_steps=0"]) == 1
    seconds = time.monotonic() - started
    line = _one_line_error(capsys, "run")
    assert "[model] name_or_path = 'nosuch/model': " in line and "not reachable" in line, line
    assert seconds < 30, seconds  # the hub's retries took 82-88 s


# --- a run directory that is a file, sft's bad numbers -----------------------------------------------------------------

@pytest.mark.parametrize("argv,command,words", [
    (["run", "--preset", "tiny", "--run-dir", "{file}"], "run", ["--run-dir {file} is a file", "a folder"]),
    (["sft", "--preset", "tiny", "--run-dir", "{file}/sub"], "sft", ["lies under {file}, a file"]),
    (["sft", "--preset", "tiny", "--run-dir", "{tmp}/s", "--batch-size", "0"], "sft", ["--batch-size 0 must be at least 1"]),
    (["sft", "--preset", "tiny", "--run-dir", "{tmp}/s", "--learning-rate", "-1"], "sft",
     ["--learning-rate -1.0 must be a positive number"]),
])
def test_bad_run_directories_and_sft_numbers_are_one_line_before_the_model_loads(argv, command, words, tmp_path,
                                                                                 monkeypatch, capsys):
    from vlrl.model import loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the command's own arguments were checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    file = tmp_path / "notes.txt"
    file.write_text("a file where a run directory was meant\n")
    fill = {"{file}": str(file), "{tmp}": str(tmp_path)}
    for key, value in fill.items():
        argv = [a.replace(key, value) for a in argv]
        words = [w.replace(key, value) for w in words]
    assert main(argv) == 1
    line = _one_line_error(capsys, command)
    assert all(word in line for word in words), line
    assert not (tmp_path / "s").exists()  # no empty sft directory left behind


# --- an empty run file -------------------------------------------------------------------------------------------------

def test_an_empty_run_file_says_what_it_runs(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing set yet\n")
    assert main(["validate", str(empty)]) == 0
    out = capsys.readouterr().out
    assert f"{empty} sets nothing, so it runs every default: run 'run', model 'tiny', data synthetic" in out, out
    assert "vlrl presets" in out


# --- what the tests install --------------------------------------------------------------------------------------------

def test_the_readme_says_what_the_tests_install_and_that_browser_tests_skip_without_it():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("make test-fast"):readme.index("The `tiny` preset runs")]
    for words in ("chromium", "chromium-driver", "apt-get", "root", "Pyodide", "npm", "skip"):
        assert words in section, words
