"""The `vlrl` command's shape: one way to name a run directory, runs/<name> by default, and one actionable line (never
a traceback) for every failure a user can cause."""

import json

import pytest

from vlrl import run
from vlrl.cli import main
from vlrl.config import runfile as cfg
from vlrl.training import warmstart


def _one_line_error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.splitlines() if line.strip()]  # progress bars may come first
    errors = [line for line in lines if line.startswith(f"vlrl {command}: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], captured.err
    return errors[0]


FAILURES = [  # (argv, command, words of the message)
    (["run", "--preset", "tinyy"], "run", ["unknown preset 'tinyy'", "Did you mean 'tiny'"]),
    (["run", "--config", "{tmp}/missing.toml"], "run", ["no run file at"]),
    (["train", "--run-dir", "{tmp}/nothing", "--resume"], "train", ["no run to resume", "--run-dir"]),
    (["sft", "--preset", "tiny", "--set", "model.load_in_4bit=true", "--run-dir", "{tmp}/sft"], "sft",
     ["4-bit weights cannot"]),
    (["eval", "--run-dir", "{tmp}/nothing"], "eval", ["has no config.toml", "--run-dir"]),
    (["report", "--run-dir", "{tmp}/nothing"], "report", ["no run directory at"]),
    (["report"], "report", ["no --run-dir was given"]),
    (["export", "--run-dir", "{tmp}/nothing", "--format", "lora"], "export", ["no run directory at"]),
    (["validate", "{tmp}/missing.toml"], "validate", ["no run file at"]),
    (["compare", "{tmp}/a.jsonl", "{tmp}/b.jsonl"], "compare", ["no record file at"]),
    (["data", "inspect", "{tmp}/nothing-here"], "data", ["neither a directory nor a file"]),
    (["data", "inspect", "synthetic", "--tasks", "bar_chartz"], "data", ["unknown synthetic tasks"]),
]


@pytest.mark.parametrize("argv,command,words", FAILURES, ids=[" ".join(f[0][:2]) for f in FAILURES])
def test_every_command_fails_with_one_actionable_line(argv, command, words, tmp_path, capsys):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    printed = _one_line_error(capsys, command)
    assert all(word in printed for word in words), printed


def test_an_eval_or_export_of_an_unfinished_run_names_what_is_missing(tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    run.start(cfg.preset("tiny"), unfinished)
    assert main(["export", "--run-dir", str(unfinished), "--format", "gguf"]) == 1
    assert "adapter" in _one_line_error(capsys, "export")
    assert main(["eval", "--run-dir", str(unfinished), "--adapter", str(unfinished / "adapter")]) == 1
    assert "no LoRA adapter at" in _one_line_error(capsys, "eval")


@pytest.mark.parametrize("argv,expected", [
    (["run", "--config", "{tmp}/mine.toml"], "runs/mine"),  # the bug: --config used to land in runs/tiny
    (["run", "--preset", "tiny"], "runs/tiny"),
    (["run"], "runs/tiny"),
    (["run", "--preset", "tiny", "--set", "name=quick"], "runs/quick"),
    (["run", "--config", "{tmp}/mine.toml", "--run-dir", "{tmp}/elsewhere"], "{tmp}/elsewhere"),
    (["train", "--config", "{tmp}/mine.toml"], "runs/mine"),
])
def test_a_run_lands_in_runs_of_its_name_unless_told(argv, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = cfg.preset("tiny")
    mine.name = "mine"
    (tmp_path / "mine.toml").write_text(cfg.to_toml(mine))
    landed = {}
    monkeypatch.setattr(run, "run", lambda config, run_dir, **_: landed.setdefault("dir", run_dir))
    monkeypatch.setattr(run, "train_only", lambda config, run_dir, **_: landed.setdefault("dir", run_dir))
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 0
    assert str(landed["dir"]) == expected.replace("{tmp}", str(tmp_path))


def test_data_inspect_shows_exactly_the_items_the_run_trains_and_evaluates(tiny_dir, capsys):
    config = cfg.preset("tiny", overrides=["data.num_items=48", "data.hold_out=8"])
    assert main(["data", "inspect", "--preset", "tiny", "--set", "data.num_items=48", "--set", "data.hold_out=8",
                 "-n", "3"]) == 0
    printed = capsys.readouterr().out
    from transformers import AutoProcessor

    train_ds, eval_ds = run.prepare(config, AutoProcessor.from_pretrained(warmstart.model_path(config)), None,
                                    log=lambda _: None)
    assert f"run 'tiny': {len(train_ds)} training items, {len(eval_ds)} held-out items" in printed
    for label, rows in (("train", train_ds), ("held-out", eval_ds)):
        for item_id in rows["id"][:3]:
            assert f"--- {label} {item_id}: answer" in printed


def test_warm_start_items_follow_the_runs_tasks_for_every_local_model():
    # `vlrl sft` on tiny-small used to ignore [data] tasks (and send "tiny-small" to the hub as a model id).
    config = cfg.preset("tiny", overrides=["model.name_or_path=tiny-small", "data.tasks=['count']",
                                           "model.warm_start_items=64"])
    items = warmstart.items(config, exclude_held_out=True)
    assert items and {item["metadata"]["task"] for item in items} == {"count"}
    assert warmstart.settings(config)["size"] == "small"


@pytest.mark.slow
def test_sft_on_tiny_small_starts_from_the_local_model(tmp_path, capsys):
    assert main(["sft", "--preset", "tiny", "--set", "model.name_or_path=tiny-small", "--set",
                 "model.warm_start_items=32", "--steps", "1", "--batch-size", "2", "--run-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "small-qwen3-vl-seed0" in printed  # the cached local model, never a hub id
    config = json.loads((tmp_path / "sft" / "config.json").read_text())
    assert config["text_config"]["hidden_size"] == 256  # tiny-small's width


def test_a_data_error_inside_vlrl_run_is_one_line(tiny_dir, tmp_path, capsys):
    # It used to print a traceback: the error family is caught once, in the CLI.
    assert main(["run", "--preset", "tiny", "--set", f"data.source={tmp_path / 'no-such-data'}",
                 "--run-dir", str(tmp_path / "run")]) == 1
    assert "neither a directory nor a file" in _one_line_error(capsys, "run")


def test_compare_reads_sampled_episodes_beside_the_evals_or_named(tmp_path, capsys):
    """`vlrl compare` of episode evals adds success@k and achievements@k from the sampled episodes beside them (or
    named with --samples), and refuses a sampled file that is not there."""
    def write(name, records):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))

    episode = {"kind": "episode", "success": False, "return": 0.0, "turns": [], "metrics": {"achievements": []}}
    for side in ("before", "after"):
        write(f"eval_{side}.jsonl", [{**episode, "id": f"seed-{s}", "seed": s} for s in range(3)])
        wood = ["collect_wood"] if side == "after" else []
        write(f"samples_{side}.jsonl", [{"id": f"seed-{s}", "kind": "episode_samples", "seed": s, "draws": [
            {"correct": bool(wood), "achievements": wood}, {"correct": False, "achievements": []}]} for s in range(3)])
    before, after = str(tmp_path / "eval_before.jsonl"), str(tmp_path / "eval_after.jsonl")
    assert main(["compare", before, after, "--output", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "success@1 0.0% -> 50.0%, success@2 0.0% -> 100.0%" in out and "collect_wood 0% -> 100%" in out
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["achievements_at_k"]["achievements_at_k_after"] == [0.5, 1.0]
    # Crafter's score over all 6 sampled episodes a side, the bootstrap drawing worlds: no per-draw McNemar pairs
    crafter = written["crafter_samples"]
    assert (crafter["samples"], crafter["worlds"], crafter["after"]["rates"]["collect_wood"]) == (2, 3, 50.0)
    assert crafter["achievements"] == {} and crafter["score_delta"] > 0
    assert "2 sampled episodes of each of 3 worlds: Crafter score 0.00%" in out
    assert main(["compare", before, after, "--samples", str(tmp_path / "samples_before.jsonl"), "/nope"]) != 0
    assert "no sampled record file at /nope" in capsys.readouterr().err


@pytest.mark.slow
def test_vlrl_eval_decodes_on_the_runs_own_path_and_a_resume_checks_it(tmp_path, monkeypatch, capsys):
    """`vlrl eval` decodes as the run's own evals do ([training] fast_generation), every record names the path that
    made it (`decoder`), and a resume on another path is refused with the difference named, so one records file
    never holds two decoders (issue 47, point 5). The static path is the GPU's; on CPU the tests run it eager."""
    from vlrl.engine import loop
    from vlrl.evaluation.records import read_records
    from vlrl.model import loading

    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    sizes = ["--set", "data.hold_out=3", "--set", "eval.batch_size=3", "--set", "eval.max_new_tokens=8"]
    rd = tmp_path / "run"
    assert main(["eval", "--preset", "tiny", "--run-dir", str(rd), *sizes]) == 0
    cli_records = read_records(rd / "eval_base.jsonl")
    assert {r["decoder"] for r in cli_records} == {"transformers, static cache, eager"}

    config = cfg.preset("tiny", overrides=[s for s in sizes if s != "--set"])
    policy, processor = loading.load_model(str(warmstart.model_path(config)), backend="transformers")
    run_records = run.evaluate_policy(config, run.pack_base(config, policy, log=print), processor,
                                      run.held_out(config, processor), rd, "before", log=lambda line: None)
    assert [(r["decoder"], r["completion"]) for r in run_records] == \
        [(r["decoder"], r["completion"]) for r in cli_records]

    assert main(["eval", "--preset", "tiny", "--run-dir", str(rd), *sizes,
                 "--set", "training.fast_generation=false"]) == 1
    printed = _one_line_error(capsys, "eval")
    assert "decoder 'transformers, static cache, eager' there, 'transformers, dynamic cache, eager' now" in printed


def bench_commands() -> list[tuple[str, list[str]]]:
    """Every `python -m vlrl ...` line of bench/*.sh (continuations joined), as (script, argv): shell variables
    stand for one word each, `${X:+...}` (present or not) is dropped, redirections and what follows them too."""
    import re
    import shlex
    from pathlib import Path

    found = []
    for script in sorted((Path(__file__).resolve().parent.parent / "bench").glob("*.sh")):
        text = script.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for match in re.finditer(r"python3? -m vlrl (.*)", line):
                words = re.split(r"\s(?:\d?>>?|\||&&|\|\||;)\s?|\s\)|\s2>&1", match.group(1))[0]
                words = re.sub(r"\$\{\w+:\+[^}]*\}", "", words).replace('"$@"', "")
                words = re.sub(r"\$\{?\w+\}?", "X", words)
                found.append((script.name, shlex.split(words)))
    return found


def test_every_vlrl_command_in_the_bench_scripts_is_one_the_cli_takes():
    """A bench script's `vlrl` command that the CLI refuses fails every time it runs; bench/gpu_jobs.sh's sampled
    evals (`vlrl eval DIR --sample`) did, unnoticed (issue 47, point 10)."""
    from vlrl.cli_parser import parser

    commands = bench_commands()
    assert len(commands) >= 10 and any(argv[0] == "eval" for _, argv in commands)
    refused = []
    for script, argv in commands:
        try:
            parser().parse_args(argv)
        except SystemExit:
            refused.append(f"{script}: vlrl {' '.join(argv)}")
    assert not refused, refused
