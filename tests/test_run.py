"""`vlrl run --preset tiny`: the whole loop on CPU, and the run directory it leaves."""

import json

import pytest

from vlrl.cli import main


@pytest.fixture(scope="module")
def run_dir(tiny_run):
    return tiny_run  # one run for the whole session (conftest), read by the export tests too


@pytest.mark.slow
def test_run_writes_every_file(run_dir):
    for name in ("config.toml", "data_report.json", "eval_before.jsonl", "eval_after.jsonl", "comparison.json",
                 "train_log.jsonl", "adapter/adapter_model.safetensors", "adapter/adapter_config.json"):
        assert (run_dir / name).exists(), name


@pytest.mark.slow
def test_run_records_and_comparison(run_dir):
    from vlrl.config import runfile as config
    from vlrl.evaluation.records import read_records

    tiny = config.preset("tiny")
    before, after = read_records(run_dir / "eval_before.jsonl"), read_records(run_dir / "eval_after.jsonl")
    assert len(before) == len(after) == tiny.data.hold_out
    assert {r["id"] for r in before} == {r["id"] for r in after}
    for record in before:
        assert {"id", "completion", "prediction", "correct", "format_ok", "reward"} <= set(record)
    comparison = json.loads((run_dir / "comparison.json").read_text())
    assert comparison["n_paired"] == tiny.data.hold_out
    assert 0 <= comparison["mcnemar_p"] <= 1
    assert config.load(run_dir / "config.toml") == config.preset("tiny", overrides=["eval.samples=4"])  # round-trips


@pytest.mark.slow
def test_run_adapter_is_trained(run_dir):
    from vlrl.export import verify_adapter

    stats = verify_adapter(run_dir / "adapter")
    assert stats["nonzero_lora_B"] > 0 and stats["all_finite"]


@pytest.mark.slow
def test_run_report_renders_in_chromium(run_dir):
    from chromium import needs_chromium, open_page  # tests/chromium.py

    from vlrl.evaluation.records import image_paths, read_records

    comparison = json.loads((run_dir / "comparison.json").read_text())
    for record in read_records(run_dir / "eval_before.jsonl"):
        assert image_paths(run_dir / "eval_images", record["id"])  # the report needs only the run directory
    assert (run_dir / "plots" / "training.png").exists() and (run_dir / "plots" / "comparison.png").exists()
    needs_chromium()
    page = open_page(run_dir / "report.html", screenshot=run_dir / "report.png")
    assert page["errors"] == [] and page["requests"] == [] and page["broken_images"] == []
    flipped = set(comparison["wrong_to_right"] + comparison["right_to_wrong"] + comparison["format_gained"]
                  + comparison["format_lost"])
    assert page["images"] == 3 + len(flipped)  # the three plots (the run samples: pass@k) and one per flipped item
    assert "pass@k: sharpening or learning" in page["text"]
    assert all(str(i) in page["text"] for i in flipped)


@pytest.mark.slow
def test_vlrl_eval_of_the_exported_adapter_reproduces_eval_after(run_dir, tmp_path):
    from vlrl.evaluation.records import read_records

    out = tmp_path / "eval_adapter.jsonl"
    assert main(["eval", "--run-dir", str(run_dir), "--adapter", str(run_dir / "adapter"), "--output", str(out)]) == 0
    after, again = read_records(run_dir / "eval_after.jsonl"), read_records(out)
    assert [r["id"] for r in again] == [r["id"] for r in after]  # the same held-out items, from config.toml alone
    assert [r["completion"] for r in again] == [r["completion"] for r in after]  # greedy: the same model, same text


@pytest.mark.slow
def test_vlrl_eval_samples_draws_reproducible_samples_and_records_the_task(run_dir, tmp_path):
    from vlrl.evaluation.compare import compare
    from vlrl.evaluation.records import read_records

    paths = [tmp_path / f"sampled_{i}.jsonl" for i in range(3)]
    for path, seed in zip(paths, (0, 0, 1)):  # 16 of the run's 40 tokens: no assertion reads an answer's end
        args = ["eval", "--run-dir", str(run_dir), "--adapter", str(run_dir / "adapter"), "--output", str(path),
                "--samples", "2", "--temperature", "1.5", "--seed", str(seed), "--batch-size", "8",
                "--max-new-tokens", "16"]
        assert main(args) == 0
    first, again, other = (read_records(p) for p in paths)
    assert all(r["do_sample"] is True and r["temperature"] == 1.5 and r["samples"] == 2 for r in first)
    assert all(r["max_new_tokens"] == 16 and d["completion_tokens"] <= 16 for r in first for d in r["draws"])
    assert all(len(r["draws"]) == 2 and r["num_correct"] == sum(d["correct"] for d in r["draws"]) for r in first)
    assert all(r["completion"] == r["draws"][0]["completion"] for r in first)  # the top level is the first draw
    assert [r["draws"] for r in again] == [r["draws"] for r in first]  # seeded: the same draws
    assert [r["draws"] for r in other] != [r["draws"] for r in first]  # another seed: other draws
    assert all(r["metadata"]["task"] for r in first)  # the generator's task, for the breakdown by task
    assert "task" in compare(run_dir / "eval_before.jsonl", paths[0])["breakdown"]
    assert compare(paths[0], paths[2])["pass_at_k"]["samples"] == 2


@pytest.mark.slow
def test_run_samples_pass_at_k_before_and_after(run_dir):
    """[eval] samples = 4 (the shared tiny run): sampled evals beside the greedy ones, pass@k in comparison.json and
    the report, and the greedy comparison unchanged by them."""
    from vlrl.evaluation import compare, passk
    from vlrl.evaluation.records import read_records

    before, after = read_records(run_dir / "samples_before.jsonl"), read_records(run_dir / "samples_after.jsonl")
    greedy = read_records(run_dir / "eval_before.jsonl")
    assert [r["id"] for r in before] == [r["id"] for r in greedy] == [r["id"] for r in after]
    assert all(len(r["draws"]) == 4 and r["do_sample"] and r["seed"] == 0 for r in before + after)
    assert all(not r["do_sample"] and "draws" not in r for r in greedy)
    stored = json.loads((run_dir / "comparison.json").read_text())
    assert stored["pass_at_k"] == json.loads(json.dumps(passk.compare_pass_at_k(before, after) | {
        "meaning": stored["pass_at_k"]["meaning"]}))
    assert stored["mcnemar_p"] == compare.compare(run_dir / "eval_before.jsonl", run_dir / "eval_after.jsonl")[
        "mcnemar_p"]
    assert stored["pass_at_k"]["k"] == [1, 2, 3, 4] and stored["pass_at_k"]["meaning"].endswith(").")
    page = (run_dir / "report.html").read_text()
    assert "pass@k: sharpening or learning" in page and (run_dir / "plots" / "pass_at_k.png").stat().st_size > 1000


def test_a_run_directory_holds_one_configuration(tmp_path):
    from vlrl.base.errors import RunDirError
    from vlrl.config import runfile as config
    from vlrl.run import start

    tiny = config.preset("tiny")
    run_dir = start(tiny, tmp_path / "run").path
    assert config.load(run_dir / "config.toml") == tiny
    assert start(tiny, run_dir).path == run_dir  # the same configuration continues in its directory
    (run_dir / "eval_before.jsonl").write_text("")  # a stage's results: now the directory is this run's
    other = config.preset("tiny")
    other.training.max_steps = 2
    with pytest.raises(RunDirError, match="holds a run with a different configuration") as refused:
        start(other, run_dir)
    assert "[training] max_steps: 8 -> 2" in str(refused.value)  # it says what changed
    assert config.load(run_dir / "config.toml") == tiny  # left as it was


def test_a_run_directory_is_claimed_once_per_run(tmp_path, monkeypatch):
    """The stages claim the directory (`vlrl.run.start`), then training gets the same RunDir: it checks and writes
    config.toml once, not again; another configuration on the same object is checked again."""
    from vlrl.config import runfile as config
    from vlrl.config.rundir import RunDir
    from vlrl.run import start
    from vlrl.training import train

    claims = []
    claim = RunDir._claim
    monkeypatch.setattr(RunDir, "_claim", lambda self, *a: claims.append(a[-1]) or claim(self, *a))

    class Built(Exception):
        pass

    def built(*args, **kwargs):
        raise Built

    monkeypatch.setattr(train, "build_trainer", built)
    tiny = config.preset("tiny")
    run = start(tiny, tmp_path / "run")
    with pytest.raises(Built):
        train.train(tiny, None, None, [], run, resume=True, log=lambda *_: None)
    assert claims == ["run"]
    other = config.preset("tiny")
    other.training.max_steps = 2
    run.start(other)
    assert claims == ["run", "run"] and config.load(run.config_file) == other


def test_a_run_that_stopped_before_any_result_leaves_no_claim(tmp_path):
    """A new user's first run stopped at load (a 4-bit preset on a CPU, an option the environment refused) and left
    config.toml and data_report.json: the corrected rerun takes the directory over instead of being refused."""
    from vlrl.config import runfile as config
    from vlrl.run import start

    first = config.preset("tiny")
    run_dir = start(first, tmp_path / "run").path
    (run_dir / "data_report.json").write_text("{}")
    corrected = config.preset("tiny")
    corrected.training.max_steps = 2
    assert start(corrected, run_dir).path == run_dir
    assert config.load(run_dir / "config.toml") == corrected


@pytest.mark.slow
def test_vlrl_eval_without_the_pictures_and_what_of_the_gain_survives(run_dir, tmp_path):
    """`vlrl eval --images blank|shuffled`: the run's held-out items with the pictures taken away, the run's own
    item pictures untouched; `vlrl compare` then reports the gain with and without the right picture."""
    import shutil

    from vlrl.evaluation.records import image_paths, read_records

    for name in ("eval_before.jsonl", "eval_after.jsonl"):
        shutil.copy(run_dir / name, tmp_path / name)
    saved = {p: p.read_bytes() for p in (run_dir / "eval_images").iterdir()}
    greedy = read_records(run_dir / "eval_before.jsonl")
    for mode in ("blank", "shuffled"):
        for side, extra in (("base", []), ("adapter", ["--adapter", str(run_dir / "adapter")])):
            out = tmp_path / f"eval_{side}_{mode}.jsonl"
            assert main(["eval", "--run-dir", str(run_dir), *extra, "--images", mode, "--output", str(out)]) == 0
            records = read_records(out)
            assert [r["id"] for r in records] == [r["id"] for r in greedy]  # one picture each: every item shuffles
    assert {p: p.read_bytes() for p in (run_dir / "eval_images").iterdir()} == saved
    assert image_paths(run_dir / "eval_images", greedy[0]["id"])
    assert main(["compare", str(tmp_path / "eval_before.jsonl"), str(tmp_path / "eval_after.jsonl"),
                 "--output", str(tmp_path / "comparison.json")]) == 0
    result = json.loads((tmp_path / "comparison.json").read_text())
    for mode in ("blank", "shuffled"):
        check = result["without_picture"][mode]
        assert check["n_paired"] == len(greedy)
        assert check["gain"] == pytest.approx(result["accuracy_delta"])
        assert 0 <= check["p_without"] <= 1 and 0 <= check["p_needs_picture"] <= 1


def test_the_runs_first_lines_name_its_optimizer_and_precision_and_why(tiny_dir):
    """The same run file trains with another optimizer or precision on another machine: the run says which, and why
    (issue 47, point 9). On this CPU: AdamW in fp32."""
    from vlrl import run
    from vlrl.config import runfile as config
    from vlrl.config.recipe import gspo_values

    lines = []
    run.load_policy(config.preset("tiny"), log=lines.append)
    assert lines[:3][-1] == ("training: optimizer adamw_torch (no CUDA GPU, which bitsandbytes' 8-bit AdamW runs on); "
                             "precision fp32 (no CUDA GPU)")
    values = gspo_values()
    assert (values["optim"], values["bf16"]) == ("adamw_torch", False)  # what the line says is what the recipe takes
