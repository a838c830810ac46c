"""Several pictures per item, end to end, and the pixel budget: docs/data.md's layouts loaded as written, the cap
counted, bad input refused in one line or counted, the budget set on the real processor as Qwen's resizing takes it
and its image tokens reported, and (slow) the tiny Qwen3-VL decoding, evaluating and training on two-chart items, with
every picture in the records and the report."""

import copy
import json
import re
from pathlib import Path

import docs_data  # tests/docs_data.py
import pytest
from PIL import Image

from vlrl import data
from vlrl.base import synthetic
from vlrl.base.errors import ConfigError, DataError
from vlrl.base.images import image_hash
from vlrl.cli import main
from vlrl.config import runfile as cfg
from vlrl.config.runfile import DataConfig
from vlrl.model import pixel_budget, prompts

ROOT = Path(__file__).resolve().parent.parent
DOCS = docs_data.section("Several pictures per item")
TWO_IMAGES = ROOT / "bench" / "learning" / "two-images.toml"


def docs_block(first_line: str) -> str:
    return docs_data.block(DOCS, first_line)


def run_docs_script(first_line: str, folder: Path) -> None:
    docs_data.run_script(DOCS, first_line, folder)


def docs_data_config(first_line: str, **changes) -> DataConfig:
    return docs_data.data_config(DOCS, first_line, **changes)


# --- docs/data.md's layouts, as written ---------------------------------------------------------------------------

def test_the_documented_jsonl_layout_places_each_picture_at_its_marker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_docs_script("# make_pairs.py:", tmp_path)
    rows, report = data.load_rows(docs_data_config("# pairs.toml"), return_report=True)
    assert report.rows_kept == 24 and report.skipped == {} and report.images_dropped == 0
    row = rows[0]
    assert [image.size for image in row["images"]] == [(64, 64), (64, 64)]
    assert row["images"][0].tobytes() != row["images"][1].tobytes()  # each path its own picture, in list order
    content = prompts.to_prompt(row)["prompt"][0]["content"]
    assert [part["type"] for part in content] == ["text", "image", "text", "image", "text"]
    assert content[0]["text"] == "Left:" and content[2]["text"] == "Right:"
    # max_images = 1: the right picture and its marker dropped, counted on the summary line
    one, report = data.load_rows(docs_data_config("# pairs.toml", max_images=1), return_report=True)
    assert "images" not in one.column_names and one[0]["question"].count("<image>") == 1
    assert (report.images_dropped, report.items_with_dropped_images) == (24, 24)
    assert "24 images over the cap of 1 dropped" in report.summary()


def test_the_documented_parquet_layout_puts_every_picture_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_docs_script("# make_parquet_pairs.py:", tmp_path)
    rows = data.load_rows(docs_data_config("# pairs_hub.toml's [data]"))
    assert len(rows) == 12
    red_blue = rows[0]
    assert [image.getpixel((0, 0)) for image in red_blue["images"]] == [(255, 0, 0), (0, 0, 255)]
    built = prompts.to_dataset(rows)  # a Dataset in: its pictures pass through undecoded
    assert [part["type"] for part in built[0]["prompt"][0]["content"]] == ["image", "image", "text"]
    assert [len(images) for images in built["images"]] == [2] * 12


# --- generated pairs ------------------------------------------------------------------------------------------------

def chart_values(item: dict) -> tuple:
    """The shown bar's value (or colour) in the first and the second chart, as the item's worked reasoning says."""
    found = re.search(r"is (\w+) in the first chart and (\w+)|from (\d+) to (\d+)", item["metadata"]["reasoning"])
    return tuple(int(v) if v.isdigit() else v for v in found.groups() if v is not None)


def test_two_chart_items_need_both_pictures():
    charts = [task for task in synthetic.MULTI_IMAGE_TASKS if task.startswith("two_chart")]  # square_shift: test_video
    items = synthetic.generate(80, seed=3, image_size=64, tasks=charts)
    for item in items:
        first, second = item["images"]
        assert item["image"] is first and first.tobytes() != second.tobytes()
        assert item["question"].count("<image>") == 2
        (v1, v2), task = chart_values(item), item["metadata"]["task"]
        if task in ("two_chart_compare", "two_chart_close"):
            expected = 1 if v1 > v2 else 2
        else:
            expected = v2 - v1 if task == "two_chart_change" else 1 if v1 == v2 else 2
        assert item["answer"] == str(expected) and (v1 != v2 or task in synthetic.SAME_TASKS)
    compare = [i["answer"] for i in items if i["metadata"]["task"] == "two_chart_compare"]
    assert set(compare) == {"1", "2"}  # one chart alone cannot tell which: both answers occur
    assert synthetic.generate(4, seed=3, image_size=64, tasks="all")[0].get("images") is None  # "all": one picture


@pytest.mark.parametrize("task,difficulty", [("two_chart_same", 1), ("two_chart_same", 2), ("two_chart_same_color", 1)])
def test_one_chart_of_a_same_or_different_pair_says_nothing_about_the_answer(task, difficulty):
    items = synthetic.generate(2000, seed=5, image_size=32, tasks=task, difficulty=difficulty)
    assert sum(item["answer"] == "1" for item in items) == 1000  # exactly half the same, for every seed
    shown = list(range(1, {1: 9, 2: 20}[difficulty] + 1)) if task == "two_chart_same" else list(synthetic.COLOR_NAMES)
    by_chart = ({}, {})
    for item in items:
        v1, v2 = chart_values(item)
        if item["answer"] == "1":
            assert v1 == v2
        else:  # "different": values a third of the scale apart or more, or two colours
            assert v1 != v2 and (task != "two_chart_same" or abs(v1 - v2) >= len(shown) / 3)
        for seen, value in zip(by_chart, (v1, v2)):
            seen.setdefault(value, []).append(item["answer"] == "1")
    for seen in by_chart:  # either chart's value alone: "same" as often as "different", whatever the value
        assert sorted(seen, key=shown.index) == shown
        rates = {value: sum(same) / len(same) for value, same in seen.items()}
        n = min(len(same) for same in seen.values())
        assert all(abs(rate - 0.5) < 4 * (0.25 / n) ** 0.5 for rate in rates.values()), rates


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_one_chart_of_a_close_pair_is_right_at_most_its_ceiling(difficulty):
    """two_chart_close: the two values exactly the gap apart, and the best answer from either chart's value alone
    (the likelier answer for each value, counted on one draw of items, scored on another) scores close_ceiling."""
    high, gap = synthetic.CLOSE_SCALE[difficulty]
    fit, scored = ([(chart_values(item), item["answer"]) for item in synthetic.generate(
        4000, seed=seed, image_size=32, tasks="two_chart_close", difficulty=difficulty)] for seed in (7, 8))
    assert all(abs(v1 - v2) == gap and 1 <= min(v1, v2) and max(v1, v2) <= high for (v1, v2), _ in fit + scored)
    assert abs(sum(answer == "1" for _, answer in scored) / len(scored) - 0.5) < 0.03
    for chart in (0, 1):
        votes = {}
        for values, answer in fit:
            votes.setdefault(values[chart], []).append(answer)
        guess = {value: max("12", key=answers.count) for value, answers in votes.items()}
        best = sum(guess.get(values[chart]) == answer for values, answer in scored) / len(scored)
        assert abs(best - synthetic.close_ceiling(difficulty)) < 0.025, (chart, best)
    assert (synthetic.close_ceiling(1), synthetic.close_ceiling(2)) == (3 / 4, 9 / 14)


def test_the_two_images_run_file_validates_and_names_two_pictures():
    config = cfg.load(TWO_IMAGES)
    assert (config.data.max_images, config.data.tasks, config.data.difficulty) == (2, ["two_chart_close"], 2)
    # the curriculum: a warm start on the wider pairs, whose cache key is the one the run used before the setting
    assert (config.model.warm_start_tasks, config.model.warm_start_difficulty) == (["two_chart_compare"], 1)
    rows, report = data.load_rows(DataConfig(**{**config.data.__dict__, "num_items": 6}), return_report=True)
    assert all(len(prompts.row_images(row)) == 2 for row in rows) and report.images_dropped == 0


# --- a warm start on other tasks than the run's (a curriculum) ----------------------------------------------------

def test_the_warm_start_tasks_and_difficulty_are_validated_in_one_line_each():
    def run_file(model=None, **data_keys):
        return cfg.from_dict({"model": {"warm_start_steps": 5, **(model or {})}, "data": data_keys})

    run_file({"warm_start_tasks": ["two_chart_compare"], "warm_start_difficulty": 1}, tasks=["two_chart_close"])
    refusals = [({"warm_start_tasks": ["two_chart_compar"]}, "warm_start_tasks names 'two_chart_compar'.*Did you mean"),
                ({"warm_start_difficulty": 4}, r"warm_start_difficulty = 4 must be 1, 2 or 3 \(0: the run's"),
                ({"warm_start_tasks": ["count"], "warm_start_steps": 0}, "warm_start_tasks needs a warm start"),
                ({"warm_start_difficulty": 2, "name_or_path": "org/model", "warm_start_steps": 0},
                 "warm_start_difficulty = 2 only applies to those: for another checkpoint set warm_start_difficulty = 0")]
    for model, words in refusals:
        with pytest.raises(ConfigError, match=words) as refused:
            run_file(model)
        assert len(refused.value.problems) == 1, refused.value.problems  # one problem, one line
    with pytest.raises(ConfigError, match=r"warm_start_tasks sets the generated items.*leave warm_start_tasks out"):
        cfg.from_dict({"model": {"warm_start_steps": 5, "warm_start_tasks": ["count"]}, "env": {"name": "grid"}})


def _curriculum_and_own_tasks():
    """The two-images run file with a small warm start: as shipped (a curriculum), and on the run's own tasks."""
    def run_file(*overrides):
        return cfg.load(TWO_IMAGES, overrides=["model.warm_start_steps=1", "model.warm_start_items=16",
                                               "data.num_items=24", "data.hold_out=6", *overrides])

    return run_file(), run_file("model.warm_start_tasks=[]", "model.warm_start_difficulty=0")


def test_a_warm_start_of_other_tasks_trains_on_them_and_keeps_their_pictures_out_of_the_held_out_set():
    from vlrl.training import warmstart

    curriculum, own = _curriculum_and_own_tasks()
    warm = warmstart.items(curriculum)
    assert {(i["metadata"]["task"], i["metadata"]["difficulty"]) for i in warm} == {("two_chart_compare", 1)}
    assert {(i["metadata"]["task"], i["metadata"]["difficulty"]) for i in warmstart.items(own)} == {
        ("two_chart_close", 2)}
    pictures = {image_hash(p) for item in warm for p in prompts.row_images(item)}
    assert warmstart.held_out_exclusions(curriculum) == pictures != warmstart.held_out_exclusions(own)
    assert warmstart.items(curriculum, exclude_held_out=True)  # `vlrl sft`'s items: the same tasks


@pytest.mark.slow
def test_a_warm_start_of_other_tasks_is_its_own_cached_model(tiny_base_dir, tmp_path, monkeypatch):
    """[model] warm_start_tasks / warm_start_difficulty enter the warm start's cache key, as a generator's version
    does; a run file that leaves them out keeps the key it had (the cached warm starts stay valid)."""
    from vlrl.training import warmstart

    curriculum, own = _curriculum_and_own_tasks()
    monkeypatch.setenv("VLRL_CACHE", str(tmp_path))
    (tmp_path / tiny_base_dir.name).symlink_to(tiny_base_dir)  # the random model, as built; only the warm start is new
    built = {Path(warmstart.model_path(config, log=lambda _: None)) for config in (curriculum, own)}
    assert len(built) == 2  # two keys, two real one-step warm starts
    keys = [json.loads((path / "warm_start.json").read_text()) for path in built]
    assert sorted((k["tasks"], k.get("difficulty", 1)) for k in keys) == [(["two_chart_close"], 2),
                                                                           (["two_chart_compare"], 1)]
    assert all("generators" not in k for k in keys)  # every generator at version 1: the key as it was before it
    monkeypatch.setitem(synthetic.GENERATOR_VERSIONS, "two_chart_compare", 2)  # a changed generator: a new warm start
    assert Path(warmstart.model_path(curriculum, log=lambda _: None)) not in built


# --- bad input: one line, or a counted skip -------------------------------------------------------------------------

def test_marker_and_picture_mismatches_and_bad_pictures_are_counted_skips(tmp_path):
    good = Image.new("RGB", (32, 32), "red")
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\ncut short")
    rows = [
        {"id": "ok", "q": "<image> and <image>: how many?", "a": "2", "pics": [good, good]},
        {"id": "more-pictures", "q": "<image> how many?", "a": "2", "pics": [good, good]},
        {"id": "more-markers", "q": "<image> <image> <image> how many?", "a": "2", "pics": [good, good]},
        {"id": "missing", "q": "how many?", "a": "2", "pics": [good, "nowhere.png"]},
        {"id": "corrupt", "q": "how many?", "a": "2", "pics": ["a.png", good]},
    ]
    ds, report = data.load_generic(rows, prompt_key="q", answer_key="a", image_keys="pics", max_images=2,
                                   image_size=32, image_root=tmp_path, return_report=True)
    assert ds["id"] == ["ok"]
    assert report.skipped == {"image_placeholder_mismatch": 2, "image_not_found": 1, "image_unreadable": 1}
    assert report.examples["image_placeholder_mismatch"] == [
        "more-pictures: 1 <image> placeholders for 2 images", "more-markers: 3 <image> placeholders for 2 images"]
    with pytest.raises(DataError, match="the prompt has 1 <image> placeholders for 2 images"):
        prompts.prompt_content("<image> which?", 2)


@pytest.mark.parametrize("overrides,words", [
    (["data.min_pixels=8192", "data.max_pixels=4096"], "min_pixels = 8192 is more than max_pixels = 4096"),
    (["data.max_pixels=100"], "less than one merged patch"),
    (["data.max_images=0"], "max_images = 0 must be at least 1"),
    (["data.image_size=0"], "generated items need a size"),
    (["data.tasks=['two_chart_compar']"], "Did you mean 'two_chart_compare'"),
])
def test_a_bad_budget_or_cap_is_one_line_before_anything_loads(overrides, words):
    with pytest.raises(ConfigError) as refused:
        cfg.load(TWO_IMAGES, overrides=overrides)
    assert words in str(refused.value) and str(refused.value).count("\n") == 0


# --- the pixel budget -----------------------------------------------------------------------------------------------

def test_the_budget_resizes_as_qwen_does_on_every_path(tiny_processor, tmp_path):
    processor = copy.deepcopy(tiny_processor)  # the session's processor stays as loaded
    big, small = Image.new("RGB", (256, 256), "red"), Image.new("RGB", (32, 32), "blue")
    own = (pixel_budget.image_tokens(processor, big), pixel_budget.image_tokens(processor, small))
    assert own == (64, 1)  # (256 / 32)^2 and one merged patch: the tiny processor's own bounds hold both
    bounds = pixel_budget.set_pixel_budget(processor, min_pixels=128 * 128, max_pixels=64 * 64 * 4)
    assert bounds == {"min_pixels": 16384, "max_pixels": 16384}
    assert (pixel_budget.image_tokens(processor, big), pixel_budget.image_tokens(processor, small)) == (16, 16)
    row = prompts.to_prompt({"id": "two", "question": "<image> or <image>?", "answer": "1", "images": [big, small]})
    text = prompts.render_prompt(row, processor)
    inputs = processor(text=[text], images=[big, small], return_tensors="pt")  # what TRL's forward calls
    assert int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()) == 32
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]
    processor.save_pretrained(tmp_path)  # the exported processor keeps the budget
    from transformers import AutoProcessor

    size = AutoProcessor.from_pretrained(tmp_path).image_processor.size
    assert (size.shortest_edge, size.longest_edge) == (16384, 16384)
    summary = pixel_budget.image_tokens_per_item(processor, [row, {"image": small}, {"image": None}])
    assert {k: summary[k] for k in ("items", "min", "median", "max")} == {"items": 3, "min": 0, "median": 16,
                                                                          "max": 32}
    with pytest.raises(ConfigError, match="no picture size lies between them"):
        pixel_budget.set_pixel_budget(copy.deepcopy(tiny_processor), min_pixels=512 * 1024)


def test_data_inspect_shows_the_image_tokens_a_budget_gives(tiny_base_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    args = ["data", "inspect", "synthetic", "--tasks", "two_chart_compare", "--max-images", "2", "--image-size", "128",
            "--processor", str(tiny_base_dir), "-n", "1", "--output", str(out)]
    assert main(args) == 0
    assert "image tokens per item: min 32, median 32, max 32 (12 items; pixel budget 1024 .. 262144)" in \
        capsys.readouterr().out  # 2 pictures of (128 / 32)^2
    assert main(args + ["--max-pixels", "4096"]) == 0
    text = capsys.readouterr().out
    assert "image tokens per item: min 8, median 8, max 8 (12 items; pixel budget 1024 .. 4096)" in text
    assert text.count("<|vision_start|>") == 2
    saved = json.loads(out.read_text())["image_tokens"]
    assert (saved["min"], saved["max"], saved["max_pixels"]) == (8, 8, 4096)


# --- the tiny Qwen3-VL on two pictures per item ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.head_lora  # the run file's LoRA on the output layer
def test_the_two_images_run_file_trains_and_every_picture_reaches_records_and_report(tmp_path):
    """bench/learning/two-images.toml, a few steps: the warm start, both evals, greedy and sampled (the engine decoding
    two pictures per context), GSPO steps (the forward over both pictures' pixel rows), the records with every picture,
    the report."""
    from vlrl import run
    from vlrl.evaluation.records import image_paths, read_records
    from vlrl.report.blocks import flips

    config = cfg.load(TWO_IMAGES, overrides=[  # a shorter warm start (cached once): the format, so rewards differ
        "model.warm_start_steps=150", "model.warm_start_items=512", "data.num_items=24", "data.hold_out=6",
        "training.max_steps=2", "training.save_steps=2", "training.max_completion_length=16",
        "training.warmup_steps=0",  # both steps train: one of them has spread enough (16 tokens cut most answers)
        "eval.max_new_tokens=16", "data.max_pixels=4096"])
    lines = []
    run.run(config, tmp_path, log=lines.append)
    assert "pixel budget: 1024 .. 4096 pixels per picture" in lines
    assert any("image tokens per item: min 8, median 8, max 8" in line for line in lines)
    before = read_records(tmp_path / "eval_before.jsonl")
    assert len(before) == 6 and all(r["question"].count("<image>") == 2 for r in before)
    assert all(r["prompt_tokens"] > 8 for r in before)  # both pictures' 4 tokens each, in the decoded context
    assert all(len(image_paths(tmp_path / "eval_images", r["id"])) == 2 for r in before)
    for side in ("before", "after"):  # the run file's sampled evals, the measure of its learning row
        sampled = read_records(tmp_path / f"samples_{side}.jsonl")
        assert [r["id"] for r in sampled] == [r["id"] for r in before] and all(len(r["draws"]) == 8 for r in sampled)
    steps = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "rewards/format_reward/mean" in s] == [1, 2]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    report = json.loads((tmp_path / "data_report.json").read_text())
    assert report["image_tokens"]["max"] == 8 and report["max_images"] == 2
    flipped = before[0]["id"]  # a flip drawn for the page: every picture of the item beside its question
    html = "".join(flips({"wrong_to_right": [flipped], "right_to_wrong": [], "format_gained": [], "format_lost": []},
                         {flipped: before[0]}, {flipped: before[0]}, tmp_path / "eval_images"))
    assert html.count(f'alt="image of {flipped}"') == 2
    assert (tmp_path / "report.html").read_text().count("<img") >= 2
