"""A new user's first hour (issue 34): their own data, one actionable line for every failure they hit, discoverable
commands, a run that tells its story, and no dead end. Each failure the issue lists has a test here."""

import json
import logging
import os
import time
from pathlib import Path

import pytest
from test_cli import FAILURES as EARLIER
from test_cli import _one_line_error  # one line, no traceback: the check test_cli's failures go through

from vlrl import run
from vlrl.cli import main, parser
from vlrl.cli_parser import COMMANDS
from vlrl.config import runfile as cfg
from vlrl.training import train


def _records(path: Path, ids, correct=True) -> Path:
    path.write_text("".join(json.dumps({"id": i, "correct": correct, "format_ok": True}) + "\n" for i in ids))
    return path


def _subparser(command: str):
    """The argparse parser of `vlrl <command>` ("data inspect": the nested one)."""
    found = parser()
    for word in command.split():
        found = next(a for a in found._actions if a.dest in ("command", "data_command", "env_command")).choices[word]
    return found


def _flags(command: str) -> set[str]:
    return {flag for action in _subparser(command)._actions for flag in action.option_strings}


FAILURES = [  # (argv, command, words of the message, seconds it may take)
    (["compare", "{tmp}", "{tmp}/b.jsonl"], "compare", ["is a directory", "eval_before.jsonl"], 10),
    (["compare", "{tmp}/a.jsonl", "{tmp}/a.jsonl", "--output", "{tmp}"], "compare",
     ["--output", "is a directory", "comparison.json"], 10),
    (["compare", "{tmp}/empty.jsonl", "{tmp}/empty.jsonl"], "compare", ["holds no records"], 10),
    (["compare", "{tmp}/a.jsonl", "{tmp}/other.jsonl"], "compare", ["share no item id"], 10),
    (["data", "inspect", "{tmp}/empty.jsonl"], "data", ["is empty", "docs/data.md"], 30),
    (["data", "inspect", "{tmp}/emptylist.json"], "data", ["holds no records"], 30),
    (["data", "inspect", "nosuch_dir"], "data", ["neither a directory nor a file"], 10),
    (["data", "inspect", "owner/nosuch"], "data", ["could not load 'owner/nosuch'", "offline"], 10),  # offline
    (["data", "inspect", "{tmp}/own", "--split", "testmini"], "data", ["splits are train", "--split"], 30),
    (["sft", "--preset", "tiny", "--steps", "-1"], "sft", ["--steps -1 must be at least 1"], 10),
    (["serve-env", "grid", "--port", "99999"], "serve-env", ["--port 99999 is not a TCP port"], 10),
    (["serve-rewards", "--port", "-2"], "serve-rewards", ["--port -2 is not a TCP port"], 10),
    (["validate", "{tmp}/nosuch.toml"], "validate", ["no run file at", "vlrl presets"], 10),
    (["run", "--preset", "tiny", "--set", "data.loader=genric"], "run", ["loader = 'genric'", "'generic'"], 10),
    (["run", "--preset", "tiny", "--set", "data.columns={questoin='q'}"], "run", ["'questoin'", "question"], 10),
]


@pytest.mark.parametrize("argv,command,words,seconds", FAILURES, ids=[" ".join(f[0][:3]) for f in FAILURES])
def test_every_failure_of_the_first_hour_is_one_line_at_once(argv, command, words, seconds, tmp_path, capsys):
    _records(tmp_path / "a.jsonl", ["1", "2"])
    _records(tmp_path / "other.jsonl", ["3", "4"])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "emptylist.json").write_text("[]")
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "train.jsonl").write_text("{}\n")
    started = time.time()
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    assert time.time() - started < seconds  # a mistyped path or an offline hub fails at once, not after retries
    printed = _one_line_error(capsys, command)
    assert all(word in printed for word in words), printed
    _assert_flags_exist(printed, command)


def _assert_flags_exist(printed: str, command: str) -> None:
    """A message suggests only flags its command has (`vlrl validate` used to suggest --preset, which it refuses)."""
    mentioned = {word.strip("(`").rstrip(".,;:)`") for word in printed.split() if word.lstrip("(`").startswith("--")}
    flags = _flags({"data": "data inspect", "env": "env play"}.get(command, command))
    assert mentioned <= flags, f"the message suggests flags {command} does not have: {printed}"


@pytest.mark.parametrize("argv,command,words", EARLIER, ids=[" ".join(f[0][:2]) for f in EARLIER])
def test_the_earlier_failures_suggest_only_flags_that_exist(argv, command, words, tmp_path, capsys):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    _assert_flags_exist(_one_line_error(capsys, command), command)


def test_compare_prints_the_summary_and_writes_the_json_to_output(tmp_path, capsys):
    before, after = _records(tmp_path / "b.jsonl", range(12), False), _records(tmp_path / "a.jsonl", range(12))
    assert main(["compare", str(before), str(after)]) == 0
    printed = capsys.readouterr().out
    assert "McNemar exact p" in printed and "{" not in printed and len(printed.splitlines()) < 10
    assert main(["compare", str(before), str(after), "--output", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["n_paired"] == 12


def test_version_presets_and_every_help_page(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == "vlrl 0.1.0"
    assert main(["presets"]) == 0
    listed = capsys.readouterr().out.splitlines()
    for name in cfg.presets():
        line = next(line for line in listed if line.split()[:1] == [name])
        preset = cfg.preset(name)
        assert preset.model.name_or_path in line and (preset.env.name or preset.data.source) in line
    for command in COMMANDS:
        text = _subparser(command).format_help()
        assert COMMANDS[command][0].split(":")[0] in " ".join(text.split()), command  # a description
        assert "example:\n  vlrl " in text, command
        for example in COMMANDS[command][1].split("\n"):  # every example parses
            parser().parse_args(example.split("#")[0].split()[1:])


# --- bringing your own data ----------------------------------------------------------------------------------------

def own_data(root: Path, pictures: int = 10, questions: int = 4) -> Path:
    """A data set of one's own, as docs/data.md describes it: train.jsonl with columns of one's own naming (uid,
    prompt, solution, picture) beside images/, `pictures` bar charts asked `questions` ways each."""
    from PIL import Image, ImageDraw

    (root / "images").mkdir(parents=True)
    asks = ["How many bars are in the chart?", "Count the bars.", "How many bars do you see?",
            "What is the number of bars?"]
    lines = []
    for k in range(pictures):
        bars = 1 + k % 5
        image = Image.new("RGB", (64, 64), "white")
        draw = ImageDraw.Draw(image)
        for b in range(bars):
            draw.rectangle([4 + b * 12, 60 - 8 * (b + k % 3 + 1), 12 + b * 12, 60], fill=(40 * k % 255, 90, 160))
        image.save(root / "images" / f"chart{k}.png")
        for q in range(questions):
            lines.append({"uid": f"mine-{k}-{q}", "prompt": asks[q % len(asks)], "solution": str(bars),
                          "picture": f"images/chart{k}.png"})
    (root / "train.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def own_run_file(path: Path, data_dir: Path) -> Path:
    """The run file of docs/data.md's example: the tiny preset on one's own data, columns mapped."""
    tiny = cfg.to_toml(cfg.preset("tiny"))
    text = tiny.replace('name = "tiny"', 'name = "own"')
    text = text.replace('source = "synthetic"', f'source = "{data_dir}"').replace('loader = "auto"', 'loader = "generic"')
    text = text.replace('split = "testmini"', 'split = "train"').replace("hold_out = 32", "hold_out = 10")
    text = text.replace("columns = {}", 'columns = {question = "prompt", answer = "solution", image = "picture", '
                        'id = "uid"}')
    path.write_text(text)
    return path


def test_a_run_file_maps_columns_keeps_ids_and_shows_every_drop(tmp_path, tiny_base_dir, capsys):
    data_dir = own_data(tmp_path / "own")
    run_file = own_run_file(tmp_path / "own.toml", data_dir)
    config = cfg.load(run_file)
    assert (config.data.loader, config.data.columns["question"]) == ("generic", "prompt")
    output = tmp_path / "x.json"
    assert main(["data", "inspect", "--config", str(run_file), "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(output.read_text())  # it used to exit 0 and write nothing
    assert saved["rows_read"] == 40 and saved["hold_out"]["eval"] == 10
    assert saved["hold_out"]["eval_excluded_seen_image"] == 0  # the warm start's pictures are generated, not these
    dropped = saved["hold_out"]["train_dropped_same_image"]
    assert dropped > 0 and f"{dropped} dropped as train_dropped_same_image" in printed  # on screen, with its reason
    assert f"run 'own': {40 - 10 - dropped} training items, 10 held-out items" in printed
    assert "--- train mine-" in printed and "own-train-" not in printed  # the user's ids, kept


def test_the_mathvista_layout_keeps_an_id_column(tmp_path):
    from vlrl import data

    own_data(tmp_path / "own", pictures=3, questions=1)
    lines = [json.loads(line) for line in (tmp_path / "own" / "train.jsonl").read_text().splitlines()]
    (tmp_path / "own" / "train.jsonl").write_text("".join(json.dumps(
        {"id": r["uid"], "question": r["prompt"], "answer": r["solution"], "image": r["picture"]}) + "\n"
        for r in lines))
    rows = data.load_rows(cfg.DataConfig(source=str(tmp_path / "own"), split="train", image_size=64))
    assert rows["id"] == ["mine-0-0", "mine-1-0", "mine-2-0"]  # not own-train-N


# --- resume, the run's story ---------------------------------------------------------------------------------------

def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    rd = run.start(cfg.preset("tiny"), tmp_path / "demo")
    last = rd.checkpoints / "checkpoint-8"
    last.mkdir(parents=True)
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 8, "max_steps": 8}))
    rd.adapter.mkdir()
    (rd.adapter / "adapter_config.json").write_text("{}")
    stamps = {p: p.stat().st_mtime_ns for p in rd.path.rglob("*")}
    assert main(["train", "--run-dir", str(rd.path), "--resume"]) == 0
    assert "training is done (checkpoint-8, step 8 of 8" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in rd.path.rglob("*")} == stamps  # no checkpoint-9, nothing rewritten
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 8}))
    assert train.done_training(rd) is None  # stopped half way: a resume trains on


def test_each_training_step_is_one_readable_line():
    from types import SimpleNamespace

    from vlrl.grammar import rewards
    from vlrl.training.callbacks import StepLine

    lines = []
    step_line = StepLine(log=lines.append)
    watched = step_line.watch(rewards.correctness_reward)
    watched(["<SOLUTION>4</SOLUTION>"] * 3 + ["<SOLUTION>5</SOLUTION>"], answer=["4"] * 4)
    logs = {"reward": 1.8, "reward_std": 0.3, "rewards/format_reward/mean": 1.0, "sampling/rollout_train_kl": 2e-4,
            "step_time": 2.5, "rollout_time": 1.5, "rollout/decode_ms_per_step": 9.83, "completions/mean_length": 33.0,
            "epoch": 0.1}
    state = SimpleNamespace(global_step=1, max_steps=8, is_world_process_zero=True)
    step_line.on_train_begin(None, state, None)  # resumed from step 1
    step_line.started -= 26  # two steps took 26 s by the wall clock
    state.global_step = 3
    step_line.on_log(None, state, None, logs=logs)
    assert logs["rewards/accuracy"] == 0.75  # kept in train_log.jsonl too
    assert lines == [("step 3/8: reward 1.80 (std 0.30), accuracy 75%, format 1.00, rollout/train KL 0.0002, "
                      "rollouts 60% of the step, a decoding step 9.8 ms, 13.0 s/step, ETA 1 min 5 s")]


def test_the_end_of_a_run_gives_the_result_the_report_and_next_commands(tmp_path):
    from vlrl.evaluation.compare import compare

    rd = run.start(cfg.preset("tiny"), tmp_path / "demo")
    comparison = compare(json.loads(json.dumps([{"id": i, "correct": i < 2, "format_ok": True} for i in range(20)])),
                         [{"id": i, "correct": i < 9, "format_ok": True} for i in range(20)])
    lines = []
    run.finish(rd, comparison, 275, log=lines.append)
    text = "\n".join(lines)
    assert "done in 4 min 35 s" in text and "10.0% [" in text and "McNemar exact p = 0.0156" in text
    assert str(rd.report) in text and str(rd.adapter) in text
    commands = [line.split("#")[0].split() for line in text.split("next:")[1].splitlines() if line.strip()]
    assert commands and all(c[0] == "vlrl" for c in commands)
    for command in commands:
        parser().parse_args(command[1:])  # only commands and flags that exist


def test_warnings_that_do_not_concern_the_user_are_silenced_at_their_source(caplog):
    import vlrl

    for name, text in vlrl.QUIET.items():
        with caplog.at_level(logging.WARNING):
            logging.getLogger(name).warning(f"[RANK 0] {text} and the rest of it")
            logging.getLogger(name).warning("another warning of the same library")
    assert [r.getMessage() for r in caplog.records] == ["another warning of the same library"] * len(vlrl.QUIET)


def test_a_training_figure_draws_only_panels_with_data(tmp_path):
    from PIL import Image

    from vlrl.report import plot_training

    episodes = [{"step": s, "reward": 0.1 * s, "rewards/success/mean": 0.1, "completions/turns_mean": 5.0,
                 "completions/invalid_actions": 2} for s in (1, 2)]
    single = [{"step": s, "reward": 0.1 * s, "rewards/format_reward/mean": 1.0, "completions/mean_length": 30.0,
               "degeneration/rate": 0.0, "sampling/rollout_train_kl": 1e-4} for s in (1, 2)]
    widths = {name: Image.open(plot_training(log, tmp_path / f"{name}.png")).size[0]
              for name, log in (("episodes", episodes), ("single", single))}
    assert widths == {"episodes": 2 * 4 * 110, "single": 4 * 4 * 110}  # 4 inches at 110 dpi a panel


def test_docs_describe_bringing_your_own_data():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "data.md").read_text()
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "docs/data.md" in readme
    section = docs.split("## Your own data")[1]
    for word in ("train.jsonl", "images/", "loader = \"generic\"", "columns = {", "vlrl data inspect --config",
                 "train_dropped_same_image", "vlrl run --config"):
        assert word in section, word
    assert os.path.basename(__file__)  # the example's data and run file are built as this file's own_data does


def test_a_perfect_score_draws_its_interval(tmp_path):
    # 10 of 10 gave a Wilson upper bound of 0.9999999999999999, a negative error bar, and a traceback at the report
    from vlrl.evaluation.compare import compare
    from vlrl.report import plot_comparison

    records = [{"id": i, "correct": False, "format_ok": True} for i in range(10)]
    comparison = compare(records, records)
    assert comparison["format_before_ci95"][1] == 1.0
    assert plot_comparison(comparison, tmp_path / "comparison.png").is_file()


def test_vlrl_run_again_over_a_finished_run_trains_nothing_and_scores_it_again(tiny_run, tmp_path, capsys):
    import shutil

    again = tmp_path / "demo"
    shutil.copytree(tiny_run, again)
    checkpoints = sorted(p.name for p in (again / "checkpoints").iterdir())
    before = (again / "eval_before.jsonl").read_text()
    comparison = json.loads((again / "comparison.json").read_text())
    assert main(["run", "--preset", "tiny", "--run-dir", str(again), "--set", "eval.samples=4"]) == 0  # tiny_run's
    printed = capsys.readouterr().out
    assert "training is done (checkpoint-8, step 8 of 8" in printed and "\nstep 1/8" not in printed
    assert sorted(p.name for p in (again / "checkpoints").iterdir()) == checkpoints  # no checkpoint-9
    assert (again / "eval_before.jsonl").read_text() == before
    # the eval after training scored the last checkpoint again: the same greedy records, the same comparison
    assert json.loads((again / "comparison.json").read_text())["mcnemar_p"] == comparison["mcnemar_p"]
    assert f"report:  {again / 'report.html'}" in printed and "next:" in printed


def test_json_files_of_ones_own_are_read_by_their_columns_whatever_the_name(tmp_path):
    from vlrl import data

    # a directory whose name mentions geo3k used to switch to geo3k's columns, and every row was skipped
    mine = own_data(tmp_path / "my-geo3k-notes", pictures=2, questions=1)
    assert data.loader_name(mine) == data.loader_name(mine / "train.jsonl") == "mathvista"
    rows = data.load_rows(cfg.DataConfig(source=str(mine), split="train", image_size=64,
                                         columns={"question": "prompt", "answer": "solution", "image": "picture",
                                                  "id": "uid"}))
    assert rows["id"] == ["mine-0-0", "mine-1-0"]
