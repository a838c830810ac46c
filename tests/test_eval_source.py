"""Training on a training split, evaluating on a test set: ViRL39K's loader on a sample of its exact layout, boxed
gold answers, `[eval] source` (its validation, the run's split, the decontamination counted), the known-test-split
warning, the presets, and all 1,000 of MathVista testmini's real annotations as an eval set."""

import gzip
import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reaches for a hub fails at once instead of hanging

import pytest
from PIL import Image

from vlrl import data, run
from vlrl.base import synthetic
from vlrl.base.errors import ConfigError
from vlrl.config import runfile as config
from vlrl.config.runfile import DataConfig, EvalConfig, RunConfig
from vlrl.data import SAMPLE_DIR, VIRL39K_SAMPLE_DIR, DataError
from vlrl.data.canonical import unboxed
from vlrl.grammar import answers

ANNOTATIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "mathvista_testmini_annotations.jsonl.gz"
SAMPLE_ANSWERS = ["17^\\circ", "8", "\\frac{3}{14}", "2\\sqrt{3}", "C", "7", "Yes", "5"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf-cache"))


@pytest.fixture
def virl_copy(tmp_path):
    """A copy of the bundled ViRL39K sample, under a name that does not say ViRL39K."""
    return Path(shutil.copytree(VIRL39K_SAMPLE_DIR, tmp_path / "mycopy"))


def meta(row: dict) -> dict:
    return {k: row[k] for k in ("precision", "question_type", "choices", "unit", "answer_type")}


# --- ViRL39K -------------------------------------------------------------------------------------------------------

def test_virl39k_sample_loads_with_answers_unboxed(cache):
    rows, report = data.load_virl39k(VIRL39K_SAMPLE_DIR, image_size=64, return_report=True, cache_dir=cache)
    assert report.rows_kept == 8 and not report.skipped and not report.numeric_only
    assert list(rows["answer"]) == SAMPLE_ANSWERS  # text, letters and expressions kept, the boxes unwrapped
    assert report.images_dropped == 1  # the two-picture item keeps its first (max_images = 1)
    assert rows[5]["question"].count("<image>") == 1
    assert rows[0]["id"] == "0a2805ce-0" and rows[0]["image"].size == (64, 64)
    for row in rows:  # every gold scores full marks against itself, under the symbolic reward the presets use
        assert answers.is_correct(row["answer"], row["answer"], symbolic=True, **meta(row)), row["answer"]
    assert answers.is_correct("17°", rows[0]["answer"], symbolic=True, **meta(rows[0]))


def test_virl39k_pictures_not_unzipped_is_one_clear_error(virl_copy):
    shutil.rmtree(virl_copy / "images")
    with pytest.raises(DataError, match=f"unzip images.zip in {virl_copy}"):
        data.load_virl39k(virl_copy)
    (virl_copy / "images.zip").unlink()
    with pytest.raises(DataError, match="download images.zip from the hub repo TIGER-Lab/ViRL39K"):
        data.load_virl39k(virl_copy)


def test_virl39k_missing_picture_is_a_counted_skip(virl_copy, cache):
    missing = max((virl_copy / "images").iterdir())
    missing.unlink()
    rows, report = data.load_virl39k(virl_copy, image_size=32, return_report=True, cache_dir=cache)
    assert report.skipped == {"image_not_found": 1} and len(rows) == 7
    assert missing.name in report.examples["image_not_found"][0]


def test_virl39k_directory_is_recognized_and_bad_sources_are_clear(virl_copy, tmp_path):
    assert data.loader_name(virl_copy) == "virl39k"
    assert data.loader_name(SAMPLE_DIR) == "mathvista"
    with pytest.raises(DataError, match="one split, 'train'"):
        data.load_virl39k(virl_copy, split="test")
    with pytest.raises(DataError, match="holds no 39Krelease.parquet.*hf download TIGER-Lab/ViRL39K"):
        data.load_virl39k(tmp_path)
    (virl_copy / "39Krelease.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(DataError, match="not a readable parquet file"):
        data.load_virl39k(virl_copy)


def test_virl39k_hub_id_downloads_two_files_and_unzips_once(tmp_path, monkeypatch, cache):
    import huggingface_hub

    blobs = tmp_path / "hub"  # what hf_hub_download returns: a cached file of the repo
    shutil.copytree(VIRL39K_SAMPLE_DIR, blobs, ignore=shutil.ignore_patterns("images"))
    asked = []

    def download(repo_id, filename, repo_type=None, **_):
        asked.append((repo_id, filename, repo_type))
        return str(blobs / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setenv("VLRL_CACHE", str(tmp_path / "vlrl-cache"))
    rows = data.load_virl39k("TIGER-Lab/ViRL39K", image_size=32, cache_dir=cache)
    assert list(rows["answer"]) == SAMPLE_ANSWERS
    assert asked == [("TIGER-Lab/ViRL39K", name, "dataset") for name in ("39Krelease.parquet", "images.zip")]
    unzipped = next((tmp_path / "vlrl-cache" / "ViRL39K").iterdir())
    assert (unzipped / ".complete").exists() and len(list((unzipped / "images").iterdir())) == 9
    marker = (unzipped / ".complete").stat().st_mtime_ns
    data.load_virl39k("TIGER-Lab/ViRL39K", image_size=32, cache_dir=cache)
    assert (unzipped / ".complete").stat().st_mtime_ns == marker  # extracted once


def test_virl39k_offline_says_how_to_download_once(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*_, **__):
        raise LocalEntryNotFoundError("offline and not in the cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(DataError, match="hf download TIGER-Lab/ViRL39K --repo-type dataset.*unzip images.zip"):
        data.load_virl39k("TIGER-Lab/ViRL39K")


@pytest.mark.parametrize("gold,expected", [
    # one box around the whole answer: unwrapped
    ("\\boxed{17^\\circ}", "17^\\circ"), ("\\boxed{B}", "B"), ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{ 3 }", "3"), ("\\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),
    # anything else: as it is
    ("\\boxed{a}+\\boxed{b}", "\\boxed{a}+\\boxed{b}"), ("x = \\boxed{4}", "x = \\boxed{4}"),
    ("\\boxed{4} cm", "\\boxed{4} cm"), ("\\boxed{a{}", "\\boxed{a{}"), ("42", "42"), (None, None),
    # an empty box is no answer (a counted missing_answer)
    ("\\boxed{}", None),
])
def test_unboxed(gold, expected):
    assert unboxed(gold) == expected


# --- [eval] source: the split and its decontamination ---------------------------------------------------------------

def eval_source_config(train_source, **changes) -> RunConfig:
    conf = RunConfig(data=DataConfig(source=str(train_source), split="train", hold_out=0, image_size=64),
                     eval=EvalConfig(source=str(SAMPLE_DIR), split="testmini"))
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(conf, section), name, value)
    return conf


def test_eval_source_trains_on_the_rest_and_drops_overlap_counted(virl_copy):
    """A ViRL39K-layout source holding one of the eval set's pictures and one of its questions with its answer."""
    import pyarrow.parquet as pq

    mathvista = json.loads((SAMPLE_DIR / "testmini.json").read_text())
    first, second = mathvista["1"], mathvista["2"]
    shutil.copy(SAMPLE_DIR / first["image"], virl_copy / "images" / "copied.png")
    table = pq.read_table(virl_copy / "39Krelease.parquet").to_pylist()
    table[1]["image"] = ["images/copied.png"]  # the same picture, another question
    table[2].update(question=second["question"].upper() + " ", answer=f"\\boxed{{{second['answer']}}}")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(virl_copy / "39Krelease.parquet")),
                   virl_copy / "39Krelease.parquet")
    conf = eval_source_config(virl_copy)
    config.validate(conf)
    train_ds, eval_ds = run.prepare(conf, None, None, log=lambda _: None)  # no processor: no length filter
    assert len(eval_ds) == len(mathvista) == 40  # every item, text and multi-choice answers included
    assert len(train_ds) == 6 and {table[1]["qid"], table[2]["qid"]}.isdisjoint(train_ds["id"])
    rows, report = data.load_rows(conf.data, return_report=True)
    run.split(conf, rows, report)
    assert report.eval_source["overlap"] == {"train": 6, "eval": 40, "train_dropped_same_id": 0,
                                             "train_dropped_same_image": 1, "train_dropped_same_question": 1}
    assert report.eval_source["rows_kept"] == 40 and report.trains_on_test_split == ""
    assert "eval source:" in str(report)
    assert list(run.eval_items(conf)["id"]) == list(eval_ds["id"])  # `vlrl eval` scores the same items


def test_drop_eval_overlap_on_generated_items():
    items = synthetic.generate(8, image_size=32)
    same_question = dict(items[1], id="other-1", image=synthetic.generate(1, seed=9, image_size=32)[0]["image"])
    report = data.DataReport(source="demo")
    same_picture = dict(items[0], id="other-0", question="What else does this picture show?")
    kept = data.drop_eval_overlap(items[2:] + [same_picture, same_question, items[1]], items[:2], report=report)
    assert [r["id"] for r in kept] == [r["id"] for r in items[2:]]
    assert report.eval_source["overlap"] == {"train": 6, "eval": 2, "train_dropped_same_id": 1,
                                             "train_dropped_same_image": 1, "train_dropped_same_question": 1}
    with pytest.raises(DataError, match="all 2 training items overlap the eval set"):
        data.drop_eval_overlap(items[:2], items[:2])


@pytest.mark.parametrize("changes,message", [
    ({"data__hold_out": 100}, "hold_out = 100 must be 0 with \\[eval\\] source"),
    ({"eval__split": ""}, "name a data set \\(hub id or directory\\) and its split"),
    ({"eval__source": "synthetic"}, "generated items are held out of \\[data\\]"),
    ({"eval__source": "", "eval__split": "testmini"}, "\\[eval\\] split = 'testmini' needs an \\[eval\\] source"),
    ({"eval__source": "", "eval__split": ""}, "hold_out = 0 must be at least 1"),
    ({"data__source": str(SAMPLE_DIR), "data__split": "testmini"}, "name \\[data\\]'s own"),
])
def test_eval_source_validation(changes, message):
    with pytest.raises(ConfigError, match=message):
        config.validate(eval_source_config(VIRL39K_SAMPLE_DIR, **changes))


def test_eval_source_round_trips_through_toml(tmp_path):
    conf = eval_source_config(VIRL39K_SAMPLE_DIR)
    (tmp_path / "run.toml").write_text(config.to_toml(conf))
    assert config.load(tmp_path / "run.toml") == conf


# --- known test splits and the presets ------------------------------------------------------------------------------

@pytest.mark.parametrize("source,split,warns", [
    ("AI4Math/MathVista", "testmini", "licence allows commercial use as a test set"),
    ("ai4math/mathvista", "test", "designed as a test set"),
    ("hiyouga/geometry3k", "test", "geo3k results are reported"),
    ("MMMU/MMMU", "validation", "MMMU reports"),
    ("AI4Math/MathVerse", "testmini", "benchmark"),
    ("MathLLMs/MathVision", "test", "benchmark"),
    (str(SAMPLE_DIR), "testmini", "a directory in MathVista's layout"),
    ("data/anything", "test", "a split named 'test'"),
    ("hiyouga/geometry3k", "validation", None),  # a development set
    ("hiyouga/geometry3k", "train", None),
    ("TIGER-Lab/ViRL39K", "train", None),
    ("synthetic", "testmini", None),  # generated items: DataConfig's default split name means nothing for them
])
def test_known_test_splits(source, split, warns):
    line = data.training_on_test_warning(source, split)
    if warns is None:
        assert line is None and data.known_test_split(source, split) is None
    else:
        assert line.startswith(f"warning: [data] trains on {source} {split}, a test split") and warns in line


def test_run_warns_in_its_log_and_report_when_training_on_a_test_split(tmp_path):
    conf = RunConfig(data=DataConfig(source=str(SAMPLE_DIR), split="testmini", hold_out=5, image_size=32))
    lines = []
    run.prepare(conf, None, tmp_path, log=lines.append)
    warning = data.training_on_test_warning(SAMPLE_DIR, "testmini")
    assert warning in lines
    assert json.loads((tmp_path / "data_report.json").read_text())["trains_on_test_split"] == warning
    conf = RunConfig(data=DataConfig(source=str(VIRL39K_SAMPLE_DIR), split="train", hold_out=2, image_size=32))
    lines.clear()
    run.prepare(conf, None, tmp_path, log=lines.append)
    assert not any("warning" in line for line in lines)
    assert json.loads((tmp_path / "data_report.json").read_text())["trains_on_test_split"] == ""


@pytest.mark.parametrize("name", config.presets())
def test_no_preset_but_the_seed_trains_on_a_test_split(name):
    preset = config.preset(name)
    d, e = preset.data, preset.eval
    line = data.training_on_test_warning(d.source, d.split)
    if name.endswith("-testmini-seed"):
        assert line and (d.source, d.split, d.hold_out, e.source) == ("AI4Math/MathVista", "testmini", 100, "")
    else:
        assert line is None
    if "mathvista" in name and not name.endswith("-seed"):
        assert (d.source, d.split, d.hold_out) == ("TIGER-Lab/ViRL39K", "train", 0)
        assert (e.source, e.split, preset.training.reward) == ("AI4Math/MathVista", "testmini", "symbolic")
        assert data.loader_name(d.source) == "virl39k" and data.loader_name(e.source) == "mathvista"


# --- MathVista testmini's 1,000 real annotations --------------------------------------------------------------------

@pytest.fixture(scope="module")
def testmini_layout(tmp_path_factory):
    """MathVista's JSON layout with testmini's real annotations, each picture generated at its real size."""
    if not ANNOTATIONS.exists():
        pytest.skip(f"no {ANNOTATIONS}")
    root = tmp_path_factory.mktemp("mathvista-testmini")
    (root / "images").mkdir()
    records = {}
    with gzip.open(ANNOTATIONS, "rt") as f:
        for line in f:
            record = json.loads(line)
            pid, size = int(record["pid"]), (record["metadata"]["img_width"], record["metadata"]["img_height"])
            picture = Image.new("RGB", size, (pid % 256, pid // 256 * 40, 90))  # one colour each: distinct pictures
            picture.save(root / record["image"], format="JPEG", quality=50)
            records[record["pid"]] = record
    (root / "testmini.json").write_text(json.dumps(records))
    return root


def test_all_of_testmini_is_the_eval_set(testmini_layout, cache):
    rows, report = data.load_eval_rows(EvalConfig(source=str(testmini_layout), split="testmini"), 64,
                                       return_report=True)
    assert report.rows_kept == 1000 and not report.skipped  # text, multi-choice and list answers all kept
    assert len({r for r in rows["id"]}) == 1000
    kinds = {(row["question_type"], row["answer_type"]) for row in rows}
    assert {("multi_choice", "text"), ("free_form", "integer"), ("free_form", "float")} <= kinds
    relettered = []  # options that are letters in another order: the gold's text reads as a letter (check_gold)
    for row in rows.select_columns(["id", "answer", "precision", "question_type", "choices", "unit", "answer_type"]):
        if answers.check_gold(row["answer"], **meta(row)):
            relettered.append(row["id"])
        else:
            for symbolic in (False, True):  # the mathvista and symbolic reward sets alike
                assert answers.is_correct(row["answer"], row["answer"], symbolic=symbolic, **meta(row)), row
        if row["choices"]:  # MathVista's hint asks for the option letter, which scores on every item
            letter = "ABCDEFGH"[row["choices"].index(row["answer"])]
            assert answers.is_correct(letter, row["answer"], symbolic=True, **meta(row)), row
    assert relettered == ["168", "849"]
    conf = eval_source_config(VIRL39K_SAMPLE_DIR, eval__source=str(testmini_layout))
    train, held = run.split(conf, data.load_rows(conf.data))
    assert len(held) == 1000 and len(train) == 8
    assert "MathVista's layout" in data.training_on_test_warning(testmini_layout, "testmini")


def test_warm_start_of_a_local_model_with_an_eval_source():
    """`vlrl sft` drops warm-start items showing an eval picture: with [eval] source, those of that source."""
    from vlrl.training import warmstart

    conf = config.preset("tiny", overrides=["data.hold_out=0", f"eval.source={SAMPLE_DIR}", "eval.split=testmini",
                                            "model.warm_start_items=16"])
    assert len(warmstart.items(conf, exclude_held_out=True)) == 16
