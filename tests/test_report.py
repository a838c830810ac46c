"""The run report: plots, a self-contained report.html with every flipped item, and that page in headless Chromium
(no console errors, no network, every image decoded)."""

import html
import json
import re
import shutil

import pytest
from chromium import needs_chromium, open_page  # tests/chromium.py

from vlrl import report
from vlrl.base import synthetic
from vlrl.base.errors import EvalError, RunDirError
from vlrl.config import runfile as config
from vlrl.evaluation import evaluate
from vlrl.evaluation.records import read_records, save_images
from vlrl.model import lengths, prompts

# Completions a model could write, scored by the real eval code: before, after.
RIGHT = "<REASONING>I read {gold}.</REASONING><SOLUTION>{gold}</SOLUTION>"
WRONG = "<REASONING>I read {wrong} & <b>not</b> {gold}.</REASONING><SOLUTION>{wrong}</SOLUTION>"
UNFORMATTED = "the answer is {wrong}"
PLAN = [(WRONG, RIGHT), (WRONG, RIGHT), (RIGHT, WRONG), (RIGHT, RIGHT), (UNFORMATTED, WRONG), (WRONG, WRONG)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as `vlrl run` leaves it, from generated items whose records the eval code scores."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    run_dir.mkdir()
    conf = config.preset("tiny")
    (run_dir / "config.toml").write_text(config.to_toml(conf))
    (run_dir / "data_report.json").write_text(json.dumps({"source": "synthetic", "rows": 96, "train": 58, "eval": 6,
                                                          "dropped_too_long": {"train": 0, "eval": 0}}))
    items = synthetic.generate(len(PLAN), seed=3, image_size=64)
    for name, side in (("eval_before.jsonl", 0), ("eval_after.jsonl", 1)):
        with (run_dir / name).open("w") as f:
            for item, plan in zip(items, PLAN):
                row = prompts.to_prompt(item)
                completion = plan[side].format(gold=item["answer"], wrong=int(item["answer"]) + 1)
                row["metadata"] = {"task": item["metadata"]["task"]}
                record = evaluate.to_record(row, completion, completion_tokens=20, finish_reason="stop")
                f.write(json.dumps(record) + "\n")
                save_images(row, run_dir / "eval_images")
    # train_log.jsonl rows in the shape TRL's GRPOTrainer logs them (see vlrl.training.callbacks.JsonlLogger)
    with (run_dir / "train_log.jsonl").open("w") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "loss": 0.01, "reward": 0.3 + 0.1 * step,
                                "rewards/format_reward/mean": 1.0 + 0.1 * step,
                                "rewards/correctness_reward/mean": 0.05 * step,
                                "completions/mean_length": 30 - step, "completions/min_length": 20 - step,
                                "completions/max_length": 40, "completions/clipped_ratio": 0.5 / step,
                                "format/degenerate_rate": 0.1 / step}) + "\n")
        f.write(json.dumps({"step": 5, "train_runtime": 12.0, "train_loss": 0.01}) + "\n")
    report.render(run_dir)
    return run_dir


def test_report_files(run_dir):
    for name in ("report.html", "plots/comparison.png", "plots/training.png", "comparison.json"):
        assert (run_dir / name).exists(), name
    for png in ("comparison", "training"):
        assert (run_dir / "plots" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_is_self_contained(run_dir):
    page = (run_dir / "report.html").read_text()
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "Content-Security-Policy" in page


def test_report_shows_every_flipped_item(run_dir):
    page = (run_dir / "report.html").read_text()
    comparison = json.loads((run_dir / "comparison.json").read_text())
    assert (len(comparison["wrong_to_right"]), len(comparison["right_to_wrong"])) == (2, 1)
    assert (len(comparison["format_gained"]), len(comparison["format_lost"])) == (1, 0)
    before = {r["id"]: r for r in read_records(run_dir / "eval_before.jsonl")}
    after = {r["id"]: r for r in read_records(run_dir / "eval_after.jsonl")}
    flipped = comparison["wrong_to_right"] + comparison["right_to_wrong"] + comparison["format_gained"]
    for item_id in flipped:
        block = page.split(f"<h3>{item_id}</h3>", 1)[1].split('<div class=item>', 1)[0]
        assert 'src="data:image/png;base64,' in block
        for text in (before[item_id]["question"], before[item_id]["completion"], after[item_id]["completion"]):
            assert html.escape(text) in block
        assert f"<code>{before[item_id]['gold']}</code>" in block
    assert "<b>not</b>" not in page  # completions are text, never markup
    assert all(f"<h3>{i}</h3>" not in page for i in before if i not in flipped)


def test_report_shows_config_data_and_statistics(run_dir):
    page = (run_dir / "report.html").read_text()
    assert 'name_or_path = &quot;tiny&quot;' in page and "max_prompt_tokens" in page  # the resolved config
    assert "dropped_too_long.train" in page  # the data report
    assert "McNemar exact p" in page and "By task" in page
    assert "not distinguishable from noise" in page  # 2 vs 1 flips


def test_report_notes_what_is_missing(tmp_path, run_dir):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("eval_before.jsonl", "eval_after.jsonl"):
        (bare / name).write_text((run_dir / name).read_text())
    page = report.render(bare).read_text()
    assert "no train_log.jsonl metrics" in page and "no config.toml" in page
    assert page.count("image not saved in eval_images/") == 4
    with pytest.raises(RunDirError, match="eval_after.jsonl"):
        report.render(tmp_path)
    with pytest.raises(RunDirError, match="no run directory"):
        report.render(tmp_path / "nowhere")
    (bare / "eval_after.jsonl").write_text('{"id": 1, "correct": true}\n')  # a record compare cannot use
    with pytest.raises(EvalError, match="has no format_ok"):
        report.render(bare)


def test_training_plot_skips_summary_rows():
    series = report.training_series([{"step": 1, "reward": 1.0}, {"step": 1, "train_loss": 0.3, "train_runtime": 4}])
    assert series == {"reward": ([1], [1.0])}
    assert report.plot_training([{"step": 3, "train_loss": 0.3}], "unused.png") is None


@pytest.mark.slow
def test_report_renders_in_chromium(run_dir):
    needs_chromium()
    shot = run_dir / "report.png"
    page = open_page(run_dir / "report.html", screenshot=shot)
    assert page["errors"] == [] and page["requests"] == [] and page["broken_images"] == []
    assert page["images"] == 2 + 4  # two plots; two wrong->right, one right->wrong, one format gained
    assert "not distinguishable from noise" in page["text"]
    assert shot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_chromium_check_sees_errors_and_network(tmp_path):
    needs_chromium()
    # The same page policy as the report: an outside image is refused (a CSP error) and a script cannot run.
    page = tmp_path / "bad.html"
    page.write_text(f'<!doctype html><html><head><meta http-equiv="Content-Security-Policy" content="{report.CSP}">'
                    '</head><body><img alt="outside" src="http://127.0.0.1:9/x.png">'
                    '<script>console.error("ran")</script></body></html>')
    result = open_page(page)
    assert result["errors"] and not any("ran" in e for e in result["errors"])
    assert result["broken_images"] == ["outside"]


# --- the notebook views (notebooks/vlrl_walkthrough.ipynb shows these inline) ---------------------------------------

def _style_rules(page: str) -> list[str]:
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    return [selector.strip() for rule in re.findall(r"([^{}]+)\{", style) for selector in rule.split(",")]


def test_items_view_shows_images_prompts_and_measured_length(tiny_processor):
    items = synthetic.generate(3, seed=3, image_size=64)
    rows = prompts.to_dataset(items)
    page = report.items_html(rows, n=2, processor=tiny_processor)
    assert isinstance(page, report.Html) and page._repr_html_() == page
    assert page.count('<img alt="image of') == 2 and "2 of 3 items" in page
    for row in (rows[0], rows[1]):
        assert html.escape(evaluate.question(row)) in page  # the prompt's text, instruction included
        assert f"({lengths.prompt_tokens(tiny_processor, row)} tokens, image tokens included)" in page
        assert f"<td>answer</td><td><code>{row['answer']}</code></td>" in page
    assert html.escape("<|vision_start|><|image_pad|><|vision_end|>") in page
    canonical = report.items_html(items, n=1)  # canonical rows: the question as prompts.question_text builds it
    assert html.escape(prompts.question_text(items[0])) in canonical and "<td>task</td>" in canonical
    assert all(s.startswith(".vlrl") for s in _style_rules(page))  # the page's style, scoped to the view


@pytest.mark.parametrize("completion,parts", [
    ("<REASONING>4+3</REASONING><SOLUTION>7</SOLUTION>", ("+1", "+1", "+0", "exact")),
    ("<REASONING>4+3</REASONING><SOLUTION>7.0</SOLUTION>", ("+1", "+1", "+0", "numeric")),
    ("<SOLUTION>8</SOLUTION>", ("+0", "+1", "+0", "none")),
    ("addCriterion\n" * 20, ("+0", "+0", "-2", "none")),
])
def test_completion_view_breaks_the_reward_down_as_scoring_does(completion, parts):
    row = prompts.to_prompt({"id": "x", "question": "What is 4 + 3?", "image": None, "answer": "7"})
    page = report.completion_html(completion, row)
    scored = evaluate.score(completion, row)
    reasoning, solution, spam, match = parts
    assert f"<td>REASONING blocks</td><td>{completion.count('<REASONING>')}</td><td>{reasoning}</td>" in page
    assert f"<td>SOLUTION blocks</td><td>{completion.count('<SOLUTION>')}</td><td>{solution}</td>" in page
    assert f"<td>{spam}</td><td>-2 at 50% or more</td>" in page
    assert f"<td>matching rule</td><td>{match}</td>" in page
    assert f"<b>{scored['format_reward']:g}</b>" in page and f"<b>{scored['reward']:g}</b></td>" in page
    assert ("right" if scored["correct"] else "wrong") + "</h4>" in page


def test_comparison_and_flips_views_match_the_report(run_dir):
    comparison = json.loads((run_dir / "comparison.json").read_text())
    view = report.comparison_html(comparison)
    assert "not distinguishable from noise" in view and "McNemar exact p" in view
    low, high = comparison["accuracy_before_ci95"]
    assert f"<span class=ci>[{low:.1%}, {high:.1%}]</span>" in view
    flips = report.flips_html(run_dir, limit=1)  # two wrong->right, one right->wrong, one format gained
    assert flips.count("<div class=item>") == 3 and "... and 1 more in report.html" in flips
    assert f"<h3>{comparison['wrong_to_right'][0]}</h3>" in flips
    assert f"<h3>{comparison['wrong_to_right'][1]}</h3>" not in flips
    assert report.flips_html(run_dir, limit=None).count("<div class=item>") == 4


def test_files_view_lists_sizes_and_checks(tmp_path):
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\0" * 2048)
    (tmp_path / "images").mkdir()
    for name in ("a.png", "b.png"):
        (tmp_path / "images" / name).write_bytes(b"\0" * 10)
    page = report.files_html(tmp_path, {"nonzero_lora_B": 14, "all_finite": True})
    assert "<td>adapter_model.safetensors</td><td>2.0 KiB</td>" in page
    assert "<td>images/</td><td>2 files, 20 B</td>" in page
    assert "<td>nonzero_lora_B</td><td><code>14</code></td>" in page
    assert "no folder" in report.files_html(tmp_path / "missing")


def test_report_warns_at_its_top_when_the_run_trained_on_a_test_split(tmp_path, run_dir):
    from vlrl.data import training_on_test_warning

    warned = tmp_path / "warned"
    shutil.copytree(run_dir, warned)
    warning = training_on_test_warning("AI4Math/MathVista", "testmini")
    (warned / "data_report.json").write_text(json.dumps({"source": "AI4Math/MathVista", "trains_on_test_split": warning}))
    page = report.render(warned).read_text()
    assert page.index(html.escape(warning)) < page.index("<h2>Comparison</h2>")
    assert "a test split" not in (run_dir / "report.html").read_text()
