"""A video per item, end to end: docs/data.md's video layouts loaded as written (an mp4 decoded for real, a list of
frames), sampled by video_fps / max_frames, through the processor's own video path (timestamps, `video_grid_thw`,
`pixel_values_videos`), the video budget honoured or refused, bad input counted or refused in one line, the engine
decoding a clip on the tiny Qwen3-VL, the training forward fed each row's clip, and (slow) GSPO steps on the generated
shape_motion clips with every record saying which clip and frames it had."""

import copy
import json
import re
from pathlib import Path

import docs_data  # tests/docs_data.py
import pytest
from PIL import Image, ImageDraw

from vlrl import data
from vlrl.base import synthetic, video
from vlrl.base.errors import ConfigError, DataError
from vlrl.config import runfile as cfg
from vlrl.model import pixel_budget, prompts

ROOT = Path(__file__).resolve().parent.parent
DOCS = docs_data.section("A video per item")
TINY = ROOT / "vlrl" / "presets" / "tiny.toml"


def moving_dot(frames: int, *, size: int = 64, step: int = 5) -> list:
    """Frames of a red dot moving right by `step` px a frame."""
    out = []
    for t in range(frames):
        frame = Image.new("RGB", (size, size), "white")
        ImageDraw.Draw(frame).ellipse([4 + step * t, 24, 16 + step * t, 36], fill="red")
        out.append(frame)
    return out


def dot_x(frame) -> float:
    """The red dot's centre, read back from a decoded frame."""
    xs = [x for x in range(frame.width) for y in (28, 30, 32) if frame.getpixel((x, y))[1] < 100]
    return sum(xs) / len(xs)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """docs/data.md's make_clips.py, run as a user would, in its own folder."""
    folder = tmp_path_factory.mktemp("clips")
    docs_data.run_script(DOCS, "# make_clips.py:", folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tiny_base_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_base_dir).eval()


# --- decoding a real mp4 --------------------------------------------------------------------------------------------

def test_a_written_mp4_decodes_back_sampled_by_fps_and_frame_cap(tmp_path):
    path = video.write_video(moving_dot(12), tmp_path / "dot.mp4", fps=6)
    assert path.read_bytes()[4:8] == b"ftyp"  # an mp4 container, as FFmpeg wrote it
    frames, meta = video.read_video("dot.mp4", video_fps=2, max_frames=0, root=tmp_path)
    assert (meta["fps"], meta["total_num_frames"], meta["frames_indices"]) == (6.0, 12, [0, 3, 6, 9])
    assert [round(dot_x(f)) for f in frames] == [10 + 5 * i for i in (0, 3, 6, 9)]  # each kept frame is its own
    frames, meta = video.read_video("dot.mp4", video_fps=6, max_frames=4, root=tmp_path)
    assert meta["frames_indices"] == [0, 4, 7, 11] and len(frames) == 4  # the cap: spread over the whole clip
    listed, meta = video.read_video(moving_dot(5), video_fps=2, max_frames=0)  # a list of frames: shot at video_fps
    assert len(listed) == 5 and (meta["fps"], meta["source"]) == (2.0, "frames")


def test_a_write_that_fails_partway_leaves_no_file(tmp_path):
    """A frame that is no picture, after 60 the encoder has already written out: the error comes through and no
    half-written file stays."""
    with pytest.raises(AttributeError):
        video.write_video([*moving_dot(60), None], tmp_path / "bad.mp4", fps=4)  # 60: the encoder has written
    assert list(tmp_path.iterdir()) == []
    video.write_video(moving_dot(4), tmp_path / "dot.mp4", fps=4)
    assert [p.name for p in tmp_path.iterdir()] == ["dot.mp4"]  # a good write leaves its clip only


# --- docs/data.md's layouts, as written -----------------------------------------------------------------------------

@pytest.mark.parametrize("column", ["clip", "frames"])
def test_the_documented_layouts_give_the_same_clip(clips, monkeypatch, column):
    monkeypatch.chdir(clips)
    config = docs_data.data_config(DOCS, "# clips.toml:", columns={"question": "prompt", "answer": "solution", "video": column,
                                                        "id": "uid"})
    rows, report = data.load_rows(config, return_report=True)
    assert report.rows_kept == 24 and report.skipped == {}
    row = rows[0]
    assert row["image"] is None and len(row["video"]) == 8
    assert row["video_metadata"]["fps"] == 4.0 and row["video_metadata"]["frames_indices"] == list(range(8))
    assert row["video_metadata"]["source"] == ("videos/clip-0.mp4" if column == "clip" else "frames")
    xs = [dot_x(frame) for frame in row["video"]]
    assert xs == sorted(xs) and xs[-1] - xs[0] > 30  # clip-0 moves right, frame by frame, decoded in order
    content = prompts.to_prompt(row)["prompt"][0]["content"]
    assert [part["type"] for part in content] == ["video", "text"]
    built = prompts.to_dataset(rows)
    assert built.features["video"] == rows.features["video"] and len(built[0]["video"]) == 8


def test_generated_clips_go_through_an_mp4_and_need_more_than_one_frame(tmp_path):
    rows = data.load_synthetic(24, seed=5, image_size=64, tasks="shape_motion", video_fps=4, max_frames=8,
                               video_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["synthetic-5-0.mp4", "synthetic-5-1.mp4"]
    assert {row["answer"] for row in rows} == {"1", "2"}
    for row in rows:
        assert row["image"] is None and row["video_metadata"]["source"].endswith(f"{row['id']}.mp4")
        assert len(row["video"]) == 8 and row["question"].startswith("<video>")
        first, last = (_shape_x(frame) for frame in (row["video"][0], row["video"][-1]))
        assert (last > first) == (row["answer"] == "2")  # the way it moved is the answer
    # the middle of the clip says nothing of the way: guessing from where the shape is then is a coin flip
    middle = [((_shape_x(row["video"][3]) + _shape_x(row["video"][4])) / 2 > 32) == (row["answer"] == "2")
              for row in rows]
    assert 0.25 < sum(middle) / len(middle) < 0.75


@pytest.mark.parametrize("task,key,pair", [("block_motion", "video", (0, 2)), ("square_shift", "images", (0, 1))])
def test_one_picture_of_a_wrapped_square_is_a_coin_flip(task, key, pair):
    """block_motion's clips and square_shift's pairs take their square round the picture, its start uniform: where it
    is in any one frame (or picture) says nothing of the way. The likelier answer for each place (the square's dark
    columns, in eighths of the width), counted on one draw and scored on another, is right about half the time, in
    every frame; two frames tell it every time."""
    fit, scored = (synthetic.generate(1500, seed=seed, image_size=32, tasks=task) for seed in (1, 2))

    def place(frame) -> tuple:
        return tuple(sorted({x * 8 // frame.width for x in columns(frame)}))

    for k in range(len(fit[0][key])):
        votes = {}
        for item in fit:
            votes.setdefault(place(item[key][k]), []).append(item["answer"])
        guess = {at: max("12", key=answers.count) for at, answers in votes.items()}
        right = sum(guess.get(place(item[key][k])) == item["answer"] for item in scored) / len(scored)
        assert abs(right - 0.5) < 0.05, (k, right)
    for item in scored[:100]:  # two frames: the dark columns move round the frame by a few pixels, the answer's way
        first, second = (columns(item[key][k]) for k in pair)
        shift = max(range(-12, 13), key=lambda d: len({(x + d) % 32 for x in first} & second))
        assert (shift > 0) == (item["answer"] == "2") and shift != 0


def columns(frame) -> set:
    return {x for x in range(frame.width) if any(frame.getpixel((x, y))[0] < 100 for y in range(frame.height))}


def _shape_x(frame) -> float:
    xs = [x for x in range(frame.width) for y in range(frame.height) if min(frame.getpixel((x, y))) < 200]
    return sum(xs) / len(xs)


# --- the processor's own video path ---------------------------------------------------------------------------------

def test_the_processor_video_path_gives_timestamps_and_a_video_grid(tiny_processor):
    row = prompts.to_prompt({"id": "v", "question": "<video> Which way?", "answer": "2", "image": None,
                             "video": moving_dot(8), "video_metadata": {"fps": 4.0, "total_num_frames": 8,
                                                                        "frames_indices": list(range(8))}})
    text = prompts.render_prompt(row, tiny_processor)
    assert text.count("<|video_pad|>") == 1 and "<|image_pad|>" not in text
    inputs = prompts.batch_inputs(tiny_processor, [text], [], padding_side="left", videos=[prompts.row_video(row)])
    assert "pixel_values" not in inputs and "image_grid_thw" not in inputs  # not frames passed as pictures
    grid = inputs["video_grid_thw"].tolist()
    assert grid == [[4, 8, 8]]  # 8 frames in pairs; 64 px scaled up to the processor's lower bound, 128 px: 8 x 8
    assert inputs["pixel_values_videos"].shape[0] == 4 * 8 * 8
    decoded = tiny_processor.tokenizer.decode(inputs["input_ids"][0])
    assert decoded.count("<|video_pad|>") == 4 * 8 * 8 // 4  # merged 2 x 2
    assert re.findall(r"<([\d.]+) seconds>", decoded) == ["0.1", "0.6", "1.1", "1.6"]  # each pair's mid-time at 4 fps
    assert int((inputs["mm_token_type_ids"] == 2).sum()) == 64


def test_a_still_clip_keeps_the_clips_tokens_and_timestamps_and_loses_its_motion(tiny_processor):
    """`vlrl eval --images still` (the one-frame baseline): the processor sees as many frames at the same times, so
    the prompt is as long and its timestamps the same; only the motion is gone (every temporal patch alike)."""
    import torch

    from vlrl.evaluation import pictures

    rows = prompts.to_dataset(synthetic.generate(2, seed=1, image_size=64, tasks="shape_motion"))
    still = pictures.replace_pictures(rows, "still")
    for row, held in zip(rows, still):
        sides = [prompts.batch_inputs(tiny_processor, [prompts.render_prompt(r, tiny_processor)], [],
                                      padding_side="left", videos=[prompts.row_video(r)]) for r in (row, held)]
        assert sides[0]["video_grid_thw"].tolist() == sides[1]["video_grid_thw"].tolist() == [[4, 8, 8]]
        assert torch.equal(sides[0]["input_ids"], sides[1]["input_ids"])  # the same tokens, timestamps included
        patches = sides[1]["pixel_values_videos"].reshape(4, 64, -1)
        assert all(torch.equal(patches[0], patches[t]) for t in range(4))  # one frame, held
        moving = sides[0]["pixel_values_videos"].reshape(4, 64, -1)
        assert not torch.equal(moving[0], moving[3])
        x = [_shape_x(frame) for frame in held["video"]]
        assert x == [_shape_x(row["video"][3])] * 8  # the 4th of 8 frames, where the clip is about halfway


def test_video_max_pixels_is_honoured_or_refused_in_one_line(tiny_processor):
    processor = copy.deepcopy(tiny_processor)
    clip = (moving_dot(16, size=128, step=6), {"fps": 8.0, "frames_indices": list(range(16))})
    assert pixel_budget.video_tokens(processor, clip) == 8 * 8 * 8 // 4  # 16 frames in pairs of 128 px, merged 2 x 2
    bounds = pixel_budget.set_video_budget(processor, 131072)  # half the clip's 16 x 128 x 128 pixels
    assert bounds == {"video_min_pixels": 131072, "video_max_pixels": 131072}
    assert pixel_budget.video_tokens(processor, clip) < 128
    grid = processor.video_processor(**prompts.video_kwargs([clip]), return_tensors="pt")["video_grid_thw"][0]
    assert int(grid.prod()) * 16 * 16 * 2 <= 131072 * 1.0 + 1  # temporal patches of 2 frames, 16 px patches
    for budget, words in [(100_000, "below the video processor's own lower bound (131072"),
                          (1000, "less than one merged patch of two frames"), (-1, "must be 0")]:
        with pytest.raises(ConfigError, match=re.escape(words)) as refused:
            pixel_budget.set_video_budget(copy.deepcopy(tiny_processor), budget)
        assert str(refused.value).count("\n") == 0
    tokenizer_only = tiny_processor.tokenizer  # a processor with no video path: a family that takes none
    with pytest.raises(ConfigError, match="has no video processor: this model takes no video"):
        pixel_budget.check_takes_video(tokenizer_only, "[data] source 'clips'")
    with pytest.raises(ConfigError, match="has no video processor"):
        pixel_budget.set_video_budget(tokenizer_only, 262144)


# --- bad input: one line, or a counted skip -------------------------------------------------------------------------

def test_bad_videos_are_counted_skips_each_with_its_line(tmp_path):
    video.write_video(moving_dot(4), tmp_path / "good.mp4", fps=4)
    (tmp_path / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 64)
    good = (tmp_path / "good.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(good[:len(good) // 3])
    import av

    with av.open(str(tmp_path / "empty.mp4"), "w") as container:  # a container, no frame in it
        stream = container.add_stream("libx264", rate=4)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        container.start_encoding()
    rows = [
        {"id": "ok", "q": "<video> which way?", "a": "2", "v": "good.mp4"},
        {"id": "missing", "q": "which way?", "a": "2", "v": "nowhere.mp4"},
        {"id": "corrupt", "q": "which way?", "a": "2", "v": "corrupt.mp4"},
        {"id": "cut", "q": "which way?", "a": "2", "v": "cut.mp4"},
        {"id": "no-frames", "q": "which way?", "a": "2", "v": "empty.mp4"},
        {"id": "no-list", "q": "which way?", "a": "2", "v": []},
        {"id": "outside", "q": "which way?", "a": "2", "v": "../x.mp4"},
        {"id": "two-markers", "q": "<video> or <video>?", "a": "2", "v": "good.mp4"},
        {"id": "and-a-picture", "q": "which way?", "a": "2", "v": "good.mp4", "image": Image.new("RGB", (8, 8))},
    ]
    ds, report = data.load_generic(rows, prompt_key="q", answer_key="a", video_key="v", video_fps=4, max_frames=8,
                                   image_size=64, image_root=tmp_path, return_report=True)
    assert ds["id"] == ["ok"] and len(ds[0]["video"]) == 4
    assert report.skipped == {"video_not_found": 1, "video_unreadable": 2, "video_no_frames": 1, "missing_video": 1,
                              "video_path_outside_dataset": 1, "video_placeholder_mismatch": 1,
                              "video_with_images": 1}
    lines = [example for shown in report.examples.values() for example in shown]
    assert all("\n" not in line for line in lines)
    assert "missing: nowhere.mp4" in lines and "no-frames: empty.mp4: no video stream" in lines
    assert any(line.startswith("corrupt: corrupt.mp4: ") for line in lines)
    drops = report.drops()
    assert drops[0].startswith("2 skipped as video_unreadable: a video file no decoder reads (corrupt, cut short, "
                               "not a video) (e.g. corrupt: corrupt.mp4: ")
    assert "video_unreadable 2" in report.summary()
    with pytest.raises(DataError, match="2 <video> placeholders for 1 videos"):
        prompts.prompt_content("<video> or <video>?", 0, video=True)


@pytest.mark.parametrize("overrides,words", [
    (["data.video_fps=0"], "video_fps = 0.0 must be more than 0"),
    (["data.max_frames=1"], "max_frames = 1 must be 0 (no cap) or at least 2"),
    (["data.video_max_pixels=100"], "less than one merged patch of two frames"),
    (["data.tasks=['shape_motion', 'bar_value']"], "mixes video tasks (shape_motion) with picture tasks"),
])
def test_a_bad_video_setting_is_one_line_before_anything_loads(overrides, words):
    with pytest.raises(ConfigError) as refused:
        cfg.load(TINY, overrides=["data.tasks=['shape_motion']", *overrides])
    assert words in str(refused.value) and str(refused.value).count("\n") == 0


# --- the tiny Qwen3-VL on a clip ------------------------------------------------------------------------------------

def test_the_engine_decodes_with_the_clip_and_never_a_placeholder(tiny_model, tiny_processor):
    from vlrl import engine

    rows = [prompts.to_prompt(r) for r in synthetic.generate(2, seed=1, image_size=64, tasks="shape_motion")]
    texts = [prompts.render_prompt(r, tiny_processor) for r in rows]
    videos = [prompts.row_video(r) for r in rows]
    decoding = engine.decoding_for(tiny_model, tiny_processor, max_new_tokens=12, static=False, record_logps=True)
    video_pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert video_pad in decoding.suppress_ids
    done = engine.complete(tiny_model, tiny_processor, texts, [[], []], decoding, videos=videos)
    exact = prompts.batch_inputs(tiny_processor, texts[:1], [], padding_side="left", videos=videos[:1])
    assert done[0].prompt_tokens == exact["input_ids"].shape[1] > 64  # the clip's 64 tokens and their timestamps
    assert all(video_pad not in c.ids and len(c.ids) <= 12 and len(c.logps) == len(c.ids) for c in done)
    blank = [(frames[:1] * len(frames), meta) for frames, meta in videos]  # a still clip: other logits
    other = engine.complete(tiny_model, tiny_processor, texts, [[], []], decoding, videos=blank)
    assert [c.prompt_tokens for c in other] == [c.prompt_tokens for c in done]


def test_the_training_forward_is_fed_each_rows_clip(tiny_model, tiny_processor):
    """`clips_fed` gives each call of the model the rows' clips it scores, in chunks: the logits equal a forward
    given the clip directly, and differ from one without it."""
    import torch

    from vlrl.training.video_inputs import clips_fed

    rows = [prompts.to_prompt(r) for r in synthetic.generate(2, seed=2, image_size=64, tasks="shape_motion")]
    texts = [prompts.render_prompt(r, tiny_processor) for r in rows]
    per_row = [prompts.batch_inputs(tiny_processor, texts[i:i + 1], [], padding_side="left",
                                    videos=[prompts.row_video(rows[i])]) for i in range(2)]
    both = prompts.batch_inputs(tiny_processor, texts, [], padding_side="left",
                                videos=[prompts.row_video(r) for r in rows])
    clips = {"pixel_values_videos": [p["pixel_values_videos"] for p in per_row],
             "video_grid_thw": [p["video_grid_thw"] for p in per_row]}
    text_only = {k: both[k] for k in ("input_ids", "attention_mask", "mm_token_type_ids")}
    with torch.no_grad():
        direct = tiny_model(**both).logits
        with clips_fed(tiny_model, clips):  # two calls of one row each, as TRL's chunked scoring makes them
            fed = torch.cat([tiny_model(**{k: v[i:i + 1] for k, v in text_only.items()}).logits for i in range(2)])
        without = tiny_model(**text_only).logits
    assert torch.allclose(fed, direct, atol=1e-5)
    assert not torch.allclose(without, direct, atol=1e-3)


@pytest.mark.slow
def test_gspo_trains_on_generated_clips_and_records_say_which_clip(tmp_path):
    """The tiny preset on shape_motion, a few steps: the warm start on clips (cached once), both evals (the engine
    decoding each clip), GSPO steps whose forward scores the completions with their clips (the rollout/training
    mismatch stays at float noise: a forward without the clip would be far off), records and the report."""
    from vlrl import run
    from vlrl.evaluation.records import image_paths, read_records

    config = cfg.load(TINY, overrides=[
        "data.tasks=['shape_motion']", "data.video_fps=4.0", "data.max_frames=8", "data.image_size=64",
        "data.num_items=24", "data.hold_out=6", "data.max_prompt_tokens=200", "model.warm_start_steps=150",
        "model.warm_start_items=512", "training.max_steps=3", "training.save_steps=3",
        "training.per_device_train_batch_size=8", "training.num_generations=4",
        "training.max_completion_length=40", "eval.max_new_tokens=40", "eval.batch_size=6"])
    lines = []
    run.run(config, tmp_path, log=lines.append)
    assert "data: video tokens per clip: min 64, median 64, max 64 (24 clips; video pixel budget 131072 .. 786432)" \
        in lines and not any("image tokens per item" in line for line in lines)
    before = read_records(tmp_path / "eval_before.jsonl")
    assert len(before) == 6 and all(r["question"].startswith("<video>") for r in before)
    for record in before:
        assert record["video"]["frames"] == 8 and record["video"]["frames_indices"] == list(range(8))
        assert record["video"]["source"].endswith(f"{record['id']}.mp4") and record["prompt_tokens"] > 64
        assert len(image_paths(tmp_path / "eval_images", record["id"])) == 1  # the kept frames side by side
    steps = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "rewards/format_reward/mean" in s]
    assert [s["step"] for s in trained] == [1, 2, 3]
    assert all(s["sampling/rollout_train_kl"] < 1e-6 for s in trained)
    assert any(s["reward_std"] > 0 for s in trained)  # the warm start's format: rewards differ, so the steps teach
    from safetensors.torch import load_file

    adapter = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name)


@pytest.mark.slow
@pytest.mark.head_lora  # the run file's LoRA on the output layer
def test_the_video_run_file_trains_and_its_one_frame_baseline_holds_one_frame(tmp_path):
    """bench/learning/video.toml, a few steps: block_motion's warm start (a shorter one, cached once), its sampled
    evals, GSPO steps that teach (rewards differ within a group), the adapter; then `--images still` on its held-out
    items shows every clip as its one held frame."""
    from vlrl import run
    from vlrl.cli import main
    from vlrl.evaluation.records import read_records

    config = cfg.load(ROOT / "bench" / "learning" / "video.toml", overrides=[
        "model.warm_start_steps=150", "model.warm_start_items=512", "data.num_items=24", "data.hold_out=6",
        "training.max_steps=2", "training.save_steps=2", "training.warmup_steps=0", "eval.samples=2"])
    assert config.data.tasks == ["block_motion"] and config.eval.samples == 2
    lines = []
    run.run(config, tmp_path, log=lines.append)
    assert any("video tokens per clip: min 64, median 64, max 64" in line for line in lines)
    for side in ("before", "after"):
        sampled = read_records(tmp_path / f"samples_{side}.jsonl")
        assert len(sampled) == 6 and all(len(r["draws"]) == 2 and r["video"]["frames"] == 8 for r in sampled)
    steps = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "rewards/format_reward/mean" in s] == [1, 2]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    still = tmp_path / "samples_adapter_still.jsonl"  # the one-frame baseline, as bench/inputs_learning.py runs it
    assert main(["eval", "--run-dir", str(tmp_path), "--adapter", str(tmp_path / "adapter"), "--images", "still",
                 "--samples", "2", "--temperature", "1", "--seed", "0", "--output", str(still)]) == 0
    held, after = read_records(still), read_records(tmp_path / "samples_after.jsonl")
    assert [r["id"] for r in held] == [r["id"] for r in after]  # the same items, the clip's tokens kept
    assert [r["prompt_tokens"] for r in held] == [r["prompt_tokens"] for r in after]
