"""`vlrl run --preset tiny`: the whole loop on CPU, and the run directory it leaves."""

import json

import pytest


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
    from vlrl import config
    from vlrl.evaluate import read_records

    tiny = config.preset("tiny")
    before, after = read_records(run_dir / "eval_before.jsonl"), read_records(run_dir / "eval_after.jsonl")
    assert len(before) == len(after) == tiny.data.hold_out
    assert {r["id"] for r in before} == {r["id"] for r in after}
    for record in before:
        assert {"id", "completion", "prediction", "correct", "format_ok", "reward"} <= set(record)
    comparison = json.loads((run_dir / "comparison.json").read_text())
    assert comparison["n_paired"] == tiny.data.hold_out
    assert 0 <= comparison["mcnemar_p"] <= 1
    assert config.load(run_dir / "config.toml") == tiny  # the resolved configuration round-trips


@pytest.mark.slow
def test_run_adapter_is_trained(run_dir):
    from vlrl.export import verify_adapter

    stats = verify_adapter(run_dir / "adapter")
    assert stats["nonzero_lora_B"] > 0 and stats["all_finite"]
