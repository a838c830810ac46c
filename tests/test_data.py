"""vlrl.data loaders: MathVista (JSON and hub parquet layouts), geo3k, the generic loader, counted skips, caching,
prompts, and the hold-out split. Everything runs offline on the bundled sample and fixtures written here."""

import base64
import io
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reaches for a hub fails at once instead of hanging

import datasets
import numpy as np
import pytest
from PIL import Image

from data.make_mathvista_sample import write_hub_layout  # the sample's script: the root is on the path
from vlrl import data
from vlrl.base import synthetic
from vlrl.config.runfile import DataConfig
from vlrl.data import SAMPLE_DIR, DataError, DataReport
from vlrl.grammar import answers
from vlrl.model import prompts

SAMPLE = json.loads((SAMPLE_DIR / "testmini.json").read_text())


def png(color=(255, 0, 0), size=(20, 10), mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf-cache"))


@pytest.fixture(scope="module")
def sample(cache):
    return data.load_mathvista(SAMPLE_DIR, image_size=64, return_report=True, cache_dir=cache)


@pytest.fixture(scope="module")
def hub_layout(tmp_path_factory):
    """The bundled sample rewritten as MathVista's hub layout: data/testmini-*.parquet with `decoded_image`."""
    root = tmp_path_factory.mktemp("mathvista-hub")
    write_hub_layout(SAMPLE_DIR, root)
    return root


@pytest.fixture(scope="module")
def geo3k_layout(tmp_path_factory):
    """hiyouga/geometry3k's layout: data/<split>-*.parquet with `images` (a list), `problem`, `answer`."""
    root = tmp_path_factory.mktemp("geo3k")
    rows = [
        {"images": [png((0, 0, 255))], "problem": "<image>Find x.", "answer": "3"},
        {"images": [png((0, 255, 0))], "problem": "<image>Find the area of the figure.", "answer": "2\\sqrt{3}"},
        {"images": [png((255, 0, 0)), png((0, 0, 0))], "problem": "<image>Compare with <image>. Find y.",
         "answer": "12.5"},
        {"images": [b"\x89PNG\r\n\x1a\ncorrupt"], "problem": "<image>Find z.", "answer": "7"},
        {"images": [png((9, 9, 9))], "problem": "Find the perimeter.", "answer": "24"},
        {"images": [png()], "problem": "<image><image>Two placeholders, one image.", "answer": "1"},
    ]
    features = datasets.Features({"images": datasets.List(datasets.Image()), "problem": datasets.Value("string"),
                                  "answer": datasets.Value("string")})
    (root / "data").mkdir()
    for split in ("train", "test"):
        datasets.Dataset.from_list([{**r, "images": [{"bytes": b, "path": None} for b in r["images"]]}
                                    for r in rows], features=features).to_parquet(
            str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return root


# The bundled sample (MathVista's JSON layout) -------------------------------------------------------------------


def test_sample_loads_in_canonical_schema(sample):
    ds, report = sample
    assert isinstance(ds, datasets.Dataset)
    assert set(ds.column_names) == {"id", "question", "image", "answer", "answer_type", "precision", "question_type",
                                    "choices", "unit", "metadata"}
    assert report.rows_read == len(SAMPLE) == 40 and report.rows_kept == len(ds)
    for row in ds:
        assert row["image"].mode == "RGB" and row["image"].size == (64, 64)
        assert answers.parse_number(row["answer"], row["unit"]) is not None  # numeric_only
        assert answers.is_correct(row["answer"], row["answer"], **{k: row[k] for k in prompts.SCORING_COLUMNS
                                                                    if k != "answer"})
        assert row["metadata"]["category"] == "math-targeted-vqa"


def test_sample_numeric_filter_keeps_numeric_choices_and_counts_the_rest(sample):
    ds, report = sample
    expected_skips = [pid for pid, r in SAMPLE.items() if r["answer_type"] in ("text", "list")]
    assert report.skipped == {"non_numeric_answer": len(expected_skips)}
    assert sorted(set(SAMPLE) - set(ds["id"]), key=int) == sorted(expected_skips, key=int)
    multi = [r for r in ds if r["question_type"] == "multi_choice"]
    assert multi and all(r["choices"] and r["answer"] in r["choices"] for r in multi)
    prompt = prompts.question_text(multi[0])
    assert "Choices: (A)" in prompt and multi[0]["choices"][0] in prompt
    floats = [r for r in ds if r["answer_type"] == "float"]
    assert floats and all(r["precision"] in (1.0, 2.0) for r in floats)


def test_sample_modes_are_converted_and_counted(sample):
    _, report = sample
    assert {"P", "RGBA", "L", "CMYK"} <= set(report.converted_modes)


def test_numeric_only_off_keeps_everything(cache):
    ds = data.load_mathvista(SAMPLE_DIR, image_size=32, numeric_only=False, cache_dir=cache)
    assert len(ds) == 40 and {"text", "list"} <= set(ds["answer_type"])


def test_keep_aspect_pads_with_white(cache):
    ds = data.load_mathvista(SAMPLE_DIR, image_size=64, keep_aspect=True, cache_dir=cache)
    wide = next(r for r in ds if r["metadata"]["img_width"] > r["metadata"]["img_height"] + 20)
    assert wide["image"].size == (64, 64) and wide["image"].getpixel((32, 0)) == (255, 255, 255)


def test_hub_parquet_layout_matches_json_layout(hub_layout, sample, cache):
    ds, report = data.load_mathvista(str(hub_layout), image_size=64, return_report=True, cache_dir=cache)
    json_ds, json_report = sample
    assert ds["id"] == json_ds["id"] and ds["answer"] == json_ds["answer"]
    assert report.skipped == json_report.skipped
    assert data.image_hash(ds[5]["image"]) == data.image_hash(json_ds[5]["image"])  # same pixels either way


def test_preprocessing_is_cached_and_invalidated_by_edits(tmp_path):
    source = tmp_path / "sample"
    shutil.copytree(SAMPLE_DIR, source)
    cache_dir = str(tmp_path / "cache")
    first = data.load_mathvista(str(source), image_size=32, cache_dir=cache_dir)
    again = data.load_mathvista(str(source), image_size=32, cache_dir=cache_dir)
    assert first.cache_files and all(f["filename"].startswith(cache_dir) for f in first.cache_files)
    assert [f["filename"] for f in again.cache_files] == [f["filename"] for f in first.cache_files]
    pid = first[0]["id"]
    Image.new("RGB", (40, 40), (0, 200, 0)).save(source / SAMPLE[pid]["image"])  # edit one picture
    edited = data.load_mathvista(str(source), image_size=32, cache_dir=cache_dir)
    assert edited[0]["image"].getpixel((16, 16)) == (0, 200, 0)


@pytest.mark.parametrize("image_format,lossless", [("png", True), ("bmp", True), ("jpeg", False)])
def test_image_formats(cache, sample, image_format, lossless):
    ds = data.load_mathvista(SAMPLE_DIR, image_size=64, image_format=image_format, cache_dir=cache)
    reference = sample[0][0]["image"]
    assert ds[0]["image"].format == image_format.upper() and ds[0]["image"].size == (64, 64)
    difference = np.abs(np.asarray(ds[0]["image"], dtype=int) - np.asarray(reference, dtype=int)).max()
    assert (difference == 0) if lossless else (difference < 64)
    with pytest.raises(ValueError, match="image_format = 'gif'"):
        data.load_mathvista(SAMPLE_DIR, image_format="gif")


def test_test_split_without_answers_is_a_clear_error(tmp_path):
    record = {**SAMPLE["2"], "answer": ""}
    (tmp_path / "images").mkdir()
    shutil.copy(SAMPLE_DIR / record["image"], tmp_path / record["image"])
    (tmp_path / "test.json").write_text(json.dumps({"2": record}))
    with pytest.raises(DataError, match=r"no usable row among 1 \(missing_answer 1\)"):
        data.load_mathvista(str(tmp_path), split="test")


def test_unknown_sources_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="neither a directory nor a file"):
        data.load_mathvista(str(tmp_path / "missing"))
    with pytest.raises(DataError, match="hub id needs network access"):
        data.load_mathvista("AI4Math/MathVista")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="could not load"):
        data.load_mathvista(str(tmp_path / "empty"), split="testmini")


# geo3k and the generic loader -----------------------------------------------------------------------------------


def test_geo3k_layout(geo3k_layout):
    ds, report = data.load_geo3k(str(geo3k_layout), split="train", image_size=32, return_report=True)
    assert ds["answer"] == ["3", "12.5", "24"]
    assert report.skipped == {"non_numeric_answer": 1, "image_unreadable": 1, "image_placeholder_mismatch": 1}
    assert report.images_dropped == 1 and report.items_with_dropped_images == 1
    two = ds[1]
    assert two["question"] == "<image>Compare with . Find y." and two["image"].getpixel((0, 0)) == (255, 0, 0)
    prompt = prompts.to_prompt(two)["prompt"][0]["content"]
    assert [p["type"] for p in prompt] == ["image", "text"]
    assert ds[2]["id"] == f"{geo3k_layout.name}-train-4"  # no id column: <source name>-<split>-<row index>


def test_geo3k_two_images_interleaved(geo3k_layout):
    ds = data.load_geo3k(str(geo3k_layout), split="test", image_size=32, max_images=2)
    two = ds[1]
    assert [image.getpixel((0, 0)) for image in two["images"]] == [(255, 0, 0), (0, 0, 0)]
    row = prompts.to_prompt(two)
    assert [p["type"] for p in row["prompt"][0]["content"]] == ["image", "text", "image", "text"]
    assert len(row["images"]) == 2 and "image" not in row
    prompt_rows = prompts.to_dataset(ds)  # a Dataset in, images passed through undecoded
    assert "images" in prompt_rows.column_names and "image" not in prompt_rows.column_names
    assert [len(r["images"]) for r in prompt_rows] == [1, 2, 1]
    assert prompt_rows[1]["images"][1].getpixel((0, 0)) == (0, 0, 0)


def test_generic_reads_every_image_form_in_one_list(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png())
    raw = png()
    forms = [Image.new("RGB", (20, 10), (255, 0, 0)), raw, {"bytes": raw, "path": None},
             {"bytes": None, "path": "img/a.png"}, "img/a.png", str(tmp_path / "img" / "a.png"),
             np.full((10, 20, 3), (255, 0, 0), dtype=np.uint8), base64.b64encode(raw).decode(),
             "data:image/png;base64," + base64.b64encode(raw).decode(), [raw]]
    rows = [{"q": f"What is {i}?", "a": str(i), "picture": form} for i, form in enumerate(forms)]
    ds, report = data.load_generic(rows, prompt_key="q", answer_key="a", image_keys="picture",
                                   image_root=tmp_path, image_size=16, return_report=True)
    assert report.skipped == {} and len(ds) == len(forms)
    assert all(r["image"].getpixel((8, 8)) == (255, 0, 0) for r in ds)
    assert ds["id"] == [f"<list>-train-{i}" for i in range(len(forms))]


def test_generic_counts_every_bad_input_reason(tmp_path):
    """One row per skip reason (too_long is the length filter's, tested with the processor); none stops the load."""
    root = tmp_path / "set"
    root.mkdir()
    (tmp_path / "outside.png").write_bytes(png())
    jpeg = io.BytesIO()
    Image.effect_noise((64, 64), 40).convert("RGB").save(jpeg, format="JPEG")
    good = {"question": "How many?", "answer": "3", "image": png()}
    rows = [
        {**good, "id": "ok"},
        "not a dict",
        {**good, "id": "q", "question": "  "},
        {**good, "id": "a", "answer": None},
        {**good, "id": "n", "answer": "seven"},
        {**good, "id": "c", "answer": "9", "choices": ["3", "4"], "question_type": "multi_choice"},
        {**good, "id": "ok"},
        {**good, "id": "m", "image": None},
        {**good, "id": "p", "question": "<image> and <image>?"},
        {**good, "id": "f", "image": "images/none.png"},
        {**good, "id": "o", "image": "../outside.png"},
        {**good, "id": "t", "image": jpeg.getvalue()[:800]},
        {**good, "id": "u", "image": b"garbage"},
        {**good, "id": "e", "image": np.zeros((0, 4), dtype=np.uint8)},
        {**good, "id": "l", "image": png(size=(300, 300))},
        {**good, "id": "x", "image": "ftp://example.com/a.png"},
    ]
    ds, report = data.load_generic(rows, image_root=root, max_pixels=200 * 200, image_size=16, return_report=True)
    assert ds["id"] == ["ok"]
    video = {reason for reason in data.SKIP_REASONS if "video" in reason}  # a video column's: tests/test_video.py
    expected = set(data.SKIP_REASONS) - {"too_long"} - video
    assert set(report.skipped) == expected and all(n == 1 for n in report.skipped.values())
    assert report.rows_read == len(rows) and report.total_skipped == len(rows) - 1
    assert report.examples["image_path_outside_dataset"][0].startswith("o: ")
    saved = json.loads(report.save(tmp_path / "run" / "data_report.json").read_text())
    assert saved["skipped"] == report.skipped and saved["rows_kept"] == 1
    assert "skipped 15" in report.summary()
    assert all(reason in str(report) for reason in expected)


def test_jsonl_layout_with_bad_lines(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "1.png").write_bytes(png())
    lines = [json.dumps({"pid": "1", "question": "How many?", "answer": 3, "image": "images/1.png"}),
             "{this is not json", json.dumps([1, 2]),
             json.dumps({"pid": "2", "question": "How many?", "answer": "4", "image": "images/1.png",
                         "metadata": "free text"})]
    (tmp_path / "testmini.jsonl").write_text("\n".join(lines) + "\n")
    ds, report = data.load_mathvista(str(tmp_path), image_size=16, return_report=True)
    assert ds["id"] == ["1", "2"] and ds["answer"] == ["3", "4"]  # an int answer is read as text
    assert ds[1]["metadata"] == {"text": "free text"}
    assert report.skipped == {"invalid_record": 2}


def test_system_prompt_and_dataset_source():
    items = synthetic.generate(4, image_size=32)
    source = datasets.Dataset.from_list([{"question": i["question"], "answer": i["answer"], "image": i["image"],
                                          "id": i["id"]} for i in items])
    ds = data.load_generic(source, system_prompt="You are a careful reader of charts.", image_size=32)
    assert ds["id"] == [i["id"] for i in items]
    row = prompts.to_prompt(ds[0])
    assert [turn["role"] for turn in row["prompt"]] == ["system", "user"]
    assert "careful reader" in prompts.render_prompt(row)


# Prompts --------------------------------------------------------------------------------------------------------


def test_to_prompt_shape_for_trl():
    item = synthetic.generate(1, image_size=32)[0]
    row = prompts.to_prompt(item)
    assert set(row) == {"id", "prompt", "image", "metadata", *prompts.SCORING_COLUMNS}
    assert row["metadata"]["task"] == item["metadata"]["task"]  # eval records keep it: accuracy by task
    assert row["prompt"] == [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": prompts.question_text(item)}]}]
    text = prompts.render_prompt(row)
    assert text.count("<|image_pad|>") == 1 and text.endswith("<|im_start|>assistant\n")


def test_prompt_content_rejects_mismatched_placeholders():
    with pytest.raises(ValueError, match="2 <image> placeholders for 1 images"):
        prompts.prompt_content("<image> vs <image>", 1)


def test_to_dataset_from_canonical_dataset_keeps_images(sample):
    ds, _ = sample
    prompt_rows = prompts.to_dataset(ds)
    assert set(prompt_rows.column_names) == {"id", "prompt", "image", "metadata", *prompts.SCORING_COLUMNS}
    assert prompt_rows[0]["image"].size == (64, 64) and prompt_rows["id"] == ds["id"]
    assert prompt_rows[0]["metadata"] == ds[0]["metadata"] and "skills" in prompt_rows[0]["metadata"]
    assert data.image_hash(prompt_rows[3]["image"]) == data.image_hash(ds[3]["image"])


# Hold-out -------------------------------------------------------------------------------------------------------


def test_split_holdout_list_disjoint_by_id_and_picture():
    items = synthetic.generate(30, image_size=32)
    twin = {**items[0], "id": "copy-of-0"}  # the same picture under another id
    report = DataReport(source="synthetic")
    train, held = data.split_holdout(items + [twin], n=10, seed=3, report=report)
    assert len(held) == 10
    data.check_disjoint(train, held)
    held_hashes = {data.image_hash(r["image"]) for r in held}
    assert not any(data.image_hash(r["image"]) in held_hashes for r in train)
    assert report.hold_out["train"] == len(train) and report.hold_out["eval"] == 10
    assert len(train) + report.hold_out["train_dropped_same_image"] + report.hold_out["train_dropped_same_id"] == 21
    assert data.split_holdout(items, n=10, seed=3)[1] == data.split_holdout(items, n=10, seed=3)[1]  # seeded


def test_split_holdout_dataset(sample):
    ds, _ = sample
    train, held = data.split_holdout(ds, n=8, seed=0)
    assert isinstance(train, datasets.Dataset) and len(held) == 8
    assert not set(train["id"]) & set(held["id"])
    data.check_disjoint(prompts.to_dataset(train), prompts.to_dataset(held))


def test_load_rows_picks_the_loader_from_the_source(sample, geo3k_layout):
    ds, _ = sample
    rows, report = data.load_rows(DataConfig(source=str(SAMPLE_DIR), image_size=64), return_report=True)
    assert rows["id"] == ds["id"] and (report.source, report.split) == (str(SAMPLE_DIR), "testmini")
    assert [data.loader_name(s) for s in ("synthetic", geo3k_layout, SAMPLE_DIR)] == ["synthetic", "geo3k", "mathvista"]
    assert data.LOADERS["geo3k"] is data.load_geo3k


def test_guard_refuses_training_on_eval_items():
    items = synthetic.generate(6, image_size=32)
    assert issubclass(DataError, ValueError)  # code that catches ValueError keeps catching these
    with pytest.raises(DataError, match="training items are in the eval set"):
        data.check_disjoint(items[:4], items[3:])
    renamed = [{**items[4], "id": "renamed"}]
    with pytest.raises(DataError, match="show a picture of the eval set"):
        data.check_disjoint(items[:3] + renamed, items[4:])
    with pytest.raises(DataError, match="must be at least 1 and smaller"):
        data.split_holdout(items, n=6)


def test_large_sources_use_worker_processes_with_the_same_result(tmp_path, monkeypatch):
    """Sources of PARALLEL_ROWS rows or more are preprocessed and hashed in worker processes (ViRL39K's 38,870 rows
    took minutes in one): the rows, the splits and the overlap checks are those of one process."""
    from vlrl.data import loaders

    source = tmp_path / "sample"
    shutil.copytree(SAMPLE_DIR, source)
    one = data.load_mathvista(str(source), image_size=32, cache_dir=str(tmp_path / "one"))
    monkeypatch.setattr(loaders, "PARALLEL_ROWS", 4)
    assert loaders.preprocess_workers(len(one)) >= 1
    many = data.load_mathvista(str(source), image_size=32, cache_dir=str(tmp_path / "many"))
    assert many["id"] == one["id"] and many["answer"] == one["answer"]
    assert [data.image_hash(r["image"]) for r in many] == [data.image_hash(r["image"]) for r in one]
    assert data.picture_hashes(many) == [{data.image_hash(r["image"])} for r in one]

    train, held = data.split_holdout(many, n=8, seed=0)
    assert held["id"] == data.split_holdout(one, n=8, seed=0)[1]["id"]
    twin = held.select([0]).map(lambda r: {"id": "twin"})  # a held-out picture under another id
    assert len(data.drop_eval_overlap(datasets.concatenate_datasets([train, twin]), held)) == len(train)
    with pytest.raises(DataError, match="show a picture of the eval set"):
        data.check_disjoint(datasets.concatenate_datasets([train, twin]), held)
