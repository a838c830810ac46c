"""Multimodal-safe length: prompts are measured with the real processor (image tokens included) and dropped whole,
never truncated; plus what consumes these prompts: TRL's multimodal message preparation, `vlrl data inspect`, and
`vlrl.run.prepare` (data_report.json)."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from PIL import Image

from vlrl import data
from vlrl.base import synthetic
from vlrl.cli import main
from vlrl.model import lengths, prompts


@pytest.fixture(scope="module")
def processor(tiny_processor):
    """The tiny Qwen3-VL processor (Qwen3-VL's image settings and token ids): conftest's, of the cached random base."""
    return tiny_processor


def image_tokens(processor, row) -> int:
    text = prompts.render_prompt(row, processor)
    ids = processor(text=[text], images=prompts.row_images(row), return_tensors="pt")["input_ids"][0].tolist()
    return ids.count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>"))


def test_prompt_tokens_count_image_tokens(processor):
    item = synthetic.generate(1, image_size=64)[0]
    small = prompts.to_prompt(item)
    large = prompts.to_prompt({**item, "image": item["image"].resize((128, 128))})
    # patch 16, merge 2: 64 px -> 4x4 patches, merged 2x2 -> 4 image tokens; 128 px -> 16
    assert image_tokens(processor, small) == 4 and image_tokens(processor, large) == 16
    assert lengths.prompt_tokens(processor, large) - lengths.prompt_tokens(processor, small) == 12


def test_filter_drops_whole_prompts_and_counts_them(processor):
    items = synthetic.generate(6, image_size=64)
    items[2] = {**items[2], "image": Image.new("RGB", (512, 512), "white")}  # 256 image tokens
    prompt_rows = prompts.to_dataset(items)
    measured = [lengths.prompt_tokens(processor, row) for row in prompt_rows]
    limit = sorted(measured)[-2]  # everything but the 512 px item fits
    report = data.DataReport(source="synthetic")
    kept, dropped = lengths.filter_by_length(prompt_rows, processor, limit, report=report, part="train")
    assert dropped == 1 and len(kept) == 5 and items[2]["id"] not in kept["id"]
    assert report.too_long == {"train": 1} and report.skipped == {"too_long": 1}
    assert report.examples["too_long"][0].startswith(f"{items[2]['id']}: {max(measured)} prompt tokens")
    for row in kept:  # nothing was cut: every image still expands to all of its tokens
        assert image_tokens(processor, row) == 4 and lengths.prompt_tokens(processor, row) <= limit
    same, none = lengths.filter_by_length(prompt_rows, processor, max(measured))
    assert none == 0 and len(same) == len(prompt_rows)
    # each kept prompt's measured length travels with it: fast rollouts size their KV cache from the longest
    assert kept["prompt_tokens"] == [n for n in measured if n <= limit] and same["prompt_tokens"] == measured
    assert lengths.longest_prompt(kept) == limit and lengths.longest_prompt(prompt_rows) is None
    again, _ = lengths.filter_by_length(kept, processor, limit)  # filtered twice: one column, measured again
    assert again.column_names.count("prompt_tokens") == 1 and again["prompt_tokens"] == kept["prompt_tokens"]


def test_length_meter_matches_the_processor(processor):
    """The fast path (tokenizer + image tokens learned per size) gives exactly the processor's count."""
    items = synthetic.generate(12, image_size=64, tasks="all")
    sizes = [(64, 64), (128, 96), (64, 64), (200, 64), (128, 96), (64, 64)] * 2
    rows = [prompts.to_prompt({**item, "image": item["image"].resize(size)}) for item, size in zip(items, sizes)]
    rows.append(prompts.to_prompt({**items[0], "question": "<image> then <image>?",
                                "images": [items[0]["image"], items[1]["image"].resize((128, 96))]}))
    meter = lengths.LengthMeter(processor)
    assert [meter(row) for row in rows] == [lengths.prompt_tokens(processor, row) for row in rows]
    assert meter.checked == {(64, 64), (128, 96), (200, 64)} and not meter.exact_only


def test_multi_image_prompts_feed_trl_and_the_processor(processor):
    from trl.data_utils import prepare_multimodal_messages

    images = [Image.new("RGB", (64, 64), c) for c in ("red", "blue")]
    rows = [{"q": "<image> Left. <image> Right. Which has more red?", "a": "1", "images": images, "id": "two"}]
    ds = data.load_generic(rows, prompt_key="q", answer_key="a", image_keys="images", max_images=2, image_size=64)
    prompt_rows = prompts.to_dataset(ds)
    row = prompt_rows[0]
    messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
    filled = [part["image"] for part in messages[0]["content"] if part["type"] == "image"]
    assert [image.getpixel((0, 0)) for image in filled] == [(255, 0, 0), (0, 0, 255)]
    assert image_tokens(processor, row) == 8  # 4 per image, both expanded
    assert prompts.render_prompt(row, processor).count("<|vision_start|>") == 2


def test_cli_data_inspect(capsys, tmp_path, processor):
    base = str(processor.tokenizer.name_or_path)
    out = tmp_path / "report.json"
    assert main(["data", "inspect", str(data.SAMPLE_DIR), "-n", "2", "--image-size", "64", "--processor", base,
                 "--max-prompt-tokens", "80", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kept 33 of 40 rows" in text and "non_numeric_answer (7)" in text
    assert text.count("<|im_start|>assistant") == 2 and "prompt tokens" in text
    report = json.loads(out.read_text())
    assert report["rows_kept"] == 33 and report["max_prompt_tokens"] == 80 and "all" in report["too_long"]
    assert main(["data", "inspect", "synthetic", "-n", "1", "--image-size", "32"]) == 0
    assert "<SOLUTION>" in capsys.readouterr().out
    assert main(["data", "inspect", str(tmp_path / "nothing-here")]) == 1
    assert "neither a directory nor a file" in capsys.readouterr().err


def test_run_prepare_writes_the_data_report(tmp_path, processor):
    from vlrl import run
    from vlrl.config import runfile as config

    cfg = config.from_dict({
        "model": {"max_seq_length": 512},
        "data": {"source": str(data.SAMPLE_DIR), "image_size": 64, "hold_out": 8, "max_prompt_tokens": 80},
        "training": {"max_completion_length": 40},
        "eval": {"max_new_tokens": 40},
    })
    train_ds, eval_ds = run.prepare(cfg, processor, tmp_path, log=lambda *_: None)
    assert len(eval_ds) == 8 and len(train_ds) == 33 - 8
    assert not set(train_ds["id"]) & set(eval_ds["id"])
    report = json.loads((tmp_path / "data_report.json").read_text())
    assert report["rows_read"] == 40 and report["rows_kept"] == 33
    assert report["skipped"]["non_numeric_answer"] == 7
    assert report["hold_out"]["eval"] == 8 and report["too_long"] == {"train": 0, "eval": 0}


def test_cli_data_inspect_shows_what_a_video_budget_costs(capsys, processor):
    base = str(processor.tokenizer.name_or_path)
    flags = ["data", "inspect", "synthetic", "--tasks", "shape_motion", "--num-items", "3", "--image-size", "64",
             "--processor", base, "--video-fps", "4", "--max-frames", "8", "-n", "1"]
    assert main([*flags, "--video-max-pixels", "262144"]) == 0
    text = capsys.readouterr().out
    # 8 frames of 64x64, scaled up to the video processor's lower bound: 4 pairs of 4x4 merged patches
    assert "video tokens per clip: min 64, median 64, max 64 (3 clips; video pixel budget 131072 .. 262144)" in text
    assert "video of 8 frames at 4 fps" in text and "image tokens per item" not in text
    assert main([*flags, "--video-max-pixels", "0", "--max-frames", "6"]) == 0  # the processor's own budget
    assert "video of 6 frames" in capsys.readouterr().out
    for bad, words in ((["--max-frames", "1"], "max_frames = 1 must be 0"), (["--video-fps", "0"], "video_fps = 0.0"),
                       (["--video-max-pixels", "1000"], "video_max_pixels = 1000")):
        assert main([*flags, *bad]) == 1
        assert words in capsys.readouterr().err
