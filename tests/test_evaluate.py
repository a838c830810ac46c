"""Evaluation you can trust: the statistics against published and hand-computed values, paired comparison,
per-item records, resumption after an interrupt, and batched generation that equals one-at-a-time generation."""

import json
import math

import pytest

from vlrl import engine
from vlrl.base import synthetic
from vlrl.base.errors import EvalError
from vlrl.base.stats import mcnemar_exact, wilson
from vlrl.evaluation import evaluate
from vlrl.evaluation.compare import compare, summary
from vlrl.evaluation.records import MAX_IMAGE_SIDE, image_name, image_paths, read_records, save_images
from vlrl.grammar import answers, rewards
from vlrl.model import prompts


def rec(i, correct, format_ok=True, **extra):
    return {"id": i, "correct": correct, "format_ok": format_ok, **extra}


# --- Wilson intervals -------------------------------------------------------------------------------------------

# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3 (Wilson score,
# no continuity correction), and the 5/100 of the recipe's reported accuracy.
@pytest.mark.parametrize("k,n,low,high", [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
    (5, 100, 0.0215, 0.1118),
])
def test_wilson_published_values(k, n, low, high):
    lo, hi = wilson(k, n)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


@pytest.mark.parametrize("k,n", [(0, 1), (3, 7), (50, 100), (77, 100), (84, 100), (99, 100), (100, 100)])
def test_wilson_bounds_solve_the_score_equation(k, n):
    # The Wilson bounds are the p where the observed rate is exactly z standard errors away: (k/n - p)^2 = z^2 p(1-p)/n.
    z = 1.959964
    for p in wilson(k, n):
        if 0 < p < 1:
            assert math.isclose((k / n - p) ** 2, z * z * p * (1 - p) / n, rel_tol=1e-9, abs_tol=1e-12)
    lo, hi = wilson(k, n)
    assert 0 <= lo <= k / n <= hi <= 1


# --- exact McNemar ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("b,c,p", [
    (10, 2, 0.0386),  # the table: 2 * P(X <= 2 | 12, 1/2) = 2 * 79 / 4096 = 0.03857
    (6, 0, 0.0312),  # 2 / 2^6
    (1, 9, 0.0215),  # 2 * (1 + 10) / 1024
    (3, 10, 0.0923),  # 2 * (1 + 13 + 78 + 286) / 8192
    (3, 2, 1.0),
    (0, 0, 1.0),  # no discordant pairs: no evidence of change
    (1, 0, 1.0),
])
def test_mcnemar_known_values(b, c, p):
    assert round(mcnemar_exact(b, c), 4) == p
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)


@pytest.mark.parametrize("n", [1, 2, 5, 12, 13, 30])
def test_mcnemar_equals_binomial_enumeration(n):
    # Two-sided by definition: the probability, under Binomial(n, 1/2), of every split at least as lopsided.
    for b in range(n + 1):
        c = n - b
        extreme = sum(math.comb(n, k) for k in range(n + 1) if abs(k - n / 2) >= abs(b - n / 2)) / 2 ** n
        assert math.isclose(mcnemar_exact(b, c), min(1.0, extreme), rel_tol=1e-12)


# --- compare ----------------------------------------------------------------------------------------------------

def test_compare_the_recipes_reported_change_is_not_significant():
    # 100 items, accuracy 5% -> 6% (3 wrong->right, 2 right->wrong), format 77% -> 84% (10 gained, 3 lost).
    before = [rec(f"q{i}", i < 5, format_ok=i < 77) for i in range(100)]
    after = [rec(f"q{i}", i in (2, 3, 4, 50, 51, 52), format_ok=(3 <= i < 77) or 77 <= i < 87) for i in range(100)]
    c = compare(before, after)
    assert (c["accuracy_before"], c["accuracy_after"]) == (0.05, 0.06)
    assert (c["format_before"], c["format_after"]) == (0.77, 0.84)
    assert [round(x, 4) for x in c["accuracy_before_ci95"]] == [0.0215, 0.1118]
    assert c["wrong_to_right"] == ["q50", "q51", "q52"] and c["right_to_wrong"] == ["q0", "q1"]
    assert c["table"] == {"both_right": 3, "wrong_to_right": 3, "right_to_wrong": 2, "both_wrong": 92}
    assert c["mcnemar_p"] == 1.0
    assert (len(c["format_gained"]), len(c["format_lost"])) == (10, 3)
    assert round(c["format_mcnemar_p"], 4) == 0.0923
    assert "not distinguishable from noise" in summary(c)


def test_compare_ten_to_two_flips_is_significant():
    before = [rec(i, i >= 10) for i in range(40)]  # 10..39 right
    after = [rec(i, i < 10 or i >= 12) for i in range(40)]  # 0..9 gained, 10 and 11 lost
    c = compare(before, after)
    assert (len(c["wrong_to_right"]), len(c["right_to_wrong"])) == (10, 2)
    assert round(c["mcnemar_p"], 4) == 0.0386
    assert "a real change" in summary(c)


def test_compare_calls_out_a_policy_collapsed_onto_one_answer():
    """Seen on the tiny model (GSPO on bar comparisons it was never taught): greedy 0% -> 23.8% on 400 items, McNemar
    p = 5e-29, and every answer was "9", the largest value the charts draw. The comparison says so, with what that
    one answer scores everywhere, under the answer grammar (a letter picks its option)."""
    def item(i, prediction, gold, choices):
        ok = answers.is_correct(prediction, gold, question_type="multi_choice", choices=choices)
        return {"id": i, "correct": ok, "format_ok": True, "prediction": prediction, "gold": gold,
                "question_type": "multi_choice", "choices": choices}

    golds = [("9", ["9", "4"]), ("7", ["2", "7"]), ("9", ["3", "9"]), ("5", ["5", "1"])]
    before = [item(i, prediction, gold, choices) for i, (prediction, (gold, choices)) in
              enumerate(zip(("9", "7", "9", "1"), golds))]
    after = [item(i, "9", gold, choices) for i, (gold, choices) in enumerate(golds)]
    c = compare(before, after)
    assert c["answers_after"] == {"top": "9", "top_share": 1.0, "constant_accuracy": 0.5}
    assert c["answers_before"] == {"top": "9", "top_share": 0.5, "constant_accuracy": 0.5}
    text = summary(c)
    assert "one answer after: 100% of the items get '9', and answering it everywhere scores 50.0%" in text
    assert "one answer before" not in text  # "9" on half the items, but 75% right: 25 points above "9" alone
    letters = [item(i, "A", gold, choices) for i, (gold, choices) in enumerate(golds)]  # option A of each item
    assert compare(before, letters)["answers_after"]["constant_accuracy"] == 0.5  # options A: "9" and "5" right
    varied = [item(i, str(i), gold, choices) for i, (gold, choices) in enumerate(golds)]
    assert "one answer" not in summary(compare(varied, varied))
    right = [item(i, gold, gold, choices) for i, (gold, choices) in enumerate(golds)]  # "9" half the time, all right
    assert compare(before, right)["answers_after"]["top_share"] == 0.5
    assert "one answer after" not in summary(compare(before, right))  # 100% accuracy, far above what "9" scores
    assert compare([rec(1, True)], [rec(1, True)])["answers_after"]["top"] is None  # records without predictions


def test_compare_reports_unpaired_items_and_leaves_them_out():
    before = [rec("a", True), rec("b", False), rec("only-before", True)]
    after = [rec("a", True), rec("b", True), rec("only-after", False)]
    c = compare(before, after)
    assert (c["n_before"], c["n_after"], c["n_paired"]) == (3, 3, 2)
    assert c["only_before"] == ["only-before"] and c["only_after"] == ["only-after"]
    assert (c["accuracy_before"], c["accuracy_after"]) == (0.5, 1.0)
    assert "1 items only before, 1 only after" in summary(c)


def test_compare_needs_only_id_correct_format_ok():
    c = compare([rec(1, False)], [rec(1, True)])
    assert c["wrong_to_right"] == [1] and c["reward_mean_before"] is None and c["breakdown"] == {}
    with pytest.raises(EvalError, match="has no format_ok"):
        compare([{"id": 1, "correct": True}], [rec(1, True)])
    with pytest.raises(EvalError, match="twice"):
        compare([rec(1, True), rec(1, False)], [rec(1, True)])


def test_compare_means_of_reward_parts_and_rates():
    before = [rec(1, False, reward=0.6, completion_tokens=20, finish_reason="stop", degenerate=False),
              rec(2, False, reward=-0.6, completion_tokens=40, finish_reason="length", degenerate=True)]
    after = [rec(1, True, reward=2.6, completion_tokens=22, finish_reason="stop", degenerate=False),
             rec(2, False, reward=0.6, completion_tokens=24, finish_reason="stop", degenerate=False)]
    c = compare(before, after)
    assert c["reward_mean_before"] == 0.0 and c["reward_mean_after"] == 1.6
    assert c["completion_tokens_mean_before"] == 30 and c["completion_tokens_mean_after"] == 23
    assert (c["truncated_rate_before"], c["truncated_rate_after"]) == (0.5, 0.0)
    assert (c["degenerate_rate_before"], c["degenerate_rate_after"]) == (0.5, 0.0)


def test_compare_breaks_down_by_mathvista_metadata():
    meta = [{"skills": ["arithmetic reasoning", "statistical reasoning"], "context": "bar chart",
             "grade": "daily life"},
            {"skills": ["arithmetic reasoning"], "context": "bar chart", "grade": "elementary school"},
            {"skills": ["geometry reasoning"], "context": "geometry diagram", "grade": "high school"},
            {"skills": ["geometry reasoning"], "context": "geometry diagram", "grade": "high school"}]
    before = [rec(i, i == 2, metadata=m) for i, m in enumerate(meta)]
    after = [rec(i, i in (0, 1), metadata=m) for i, m in enumerate(meta)]
    b = compare(before, after)["breakdown"]
    assert set(b) == {"skills", "context", "grade"}
    arithmetic = b["skills"]["arithmetic reasoning"]
    assert (arithmetic["n"], arithmetic["accuracy_before"], arithmetic["accuracy_after"]) == (2, 0.0, 1.0)
    assert (arithmetic["wrong_to_right"], arithmetic["right_to_wrong"]) == (2, 0)
    assert b["skills"]["statistical reasoning"]["n"] == 1  # a list of skills counts the item in each
    assert b["context"]["geometry diagram"] == {"n": 2, "accuracy_before": 0.5, "accuracy_after": 0.0,
                                                "mcnemar_p": 1.0, "wrong_to_right": 0, "right_to_wrong": 1}
    assert b["grade"]["high school"]["n"] == 2


def test_cli_compare_writes_comparison_json(tmp_path, capsys):
    from vlrl.cli import main

    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text("".join(json.dumps(rec(i, i >= 10)) + "\n" for i in range(40)))
    after.write_text("".join(json.dumps(rec(i, i < 10 or i >= 12)) + "\n" for i in range(40)))
    assert main(["compare", str(before), str(after), "--output", str(tmp_path / "comparison.json")]) == 0
    written = json.loads((tmp_path / "comparison.json").read_text())
    assert round(written["mcnemar_p"], 4) == 0.0386 and written["n_paired"] == 40
    assert "McNemar exact p = 0.0386" in capsys.readouterr().out
    after.write_text('{"id": 1, "correct": true}\n')
    assert main(["compare", str(before), str(after)]) == 1  # a record without format_ok: an error, not a guess
    assert "format_ok" in capsys.readouterr().err


# --- records ----------------------------------------------------------------------------------------------------

def test_read_records_skips_a_torn_last_line_only(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text('{"id": "a", "correct": true}\n{"id": "b", "correct": fal')
    assert [r["id"] for r in read_records(path)] == ["a"]
    path.write_text('{"id": "a", "correct": true}\n{"id": "b", "corr\n{"id": "c", "correct": true}\n')
    with pytest.raises(EvalError, match="eval.jsonl:2"):
        read_records(path)


def test_score_agrees_with_the_rewards(items):
    completions = ["<REASONING>r</REASONING><SOLUTION>{gold}</SOLUTION>", "<SOLUTION>{gold}.0</SOLUTION>",
                   "<REASONING>r</REASONING><SOLUTION>{wrong}</SOLUTION>", "{gold}", "addCriterion\n" * 20,
                   "<REASONING>a</REASONING><SOLUTION>{gold}</SOLUTION><SOLUTION>{gold}</SOLUTION>"]
    for item in items[:6]:
        row = prompts.to_prompt(item)
        for template in completions:
            completion = template.format(gold=item["answer"], wrong=int(item["answer"]) + 1)
            record = evaluate.score(completion, row)
            correctness = rewards.correctness_reward([completion], answer=[row["answer"]])[0]
            assert record["correct"] == (correctness > 0)
            assert record["format_reward"] == rewards.format_reward([completion])[0]
            assert record["reward"] == rewards.total_reward(record["format_reward"], correctness)
            assert record["format_ok"] == (record["format_reward"] == 2.0)


# Items whose verdict depends on a scoring column: without it, the stored verdict cannot be reproduced.
@pytest.mark.parametrize("gold,columns,completion", [
    ("7", {"question_type": "multi_choice", "choices": ["3", "7"], "answer_type": "text"}, "<SOLUTION>B</SOLUTION>"),
    ("3.14", {"precision": 2.0, "answer_type": "float"}, "<SOLUTION>3.14159</SOLUTION>"),
    ("12", {"unit": "cm^2", "answer_type": "integer"}, "<SOLUTION>12 cm^2</SOLUTION>"),
])
def test_a_record_rescores_to_its_stored_verdict_on_its_own(gold, columns, completion):
    # Regression: records did not keep the scoring columns, so a multi-choice answer given by its letter was
    # "right" when scored and "wrong" when its record was scored again (the reward calculator's record browser).
    item = {"id": "x", "question": "q", "image": None, "answer": gold, **columns}
    record = json.loads(json.dumps(evaluate.to_record(prompts.to_prompt(item), f"<REASONING>r</REASONING>{completion}",
                                                      finish_reason="stop")))  # as read back from the file
    assert {k: record[k] for k in rewards.META_COLUMNS} == {k: item.get(k) for k in rewards.META_COLUMNS}
    assert record["correct"] and record["reward"] > 2
    rescored = evaluate.rescore(record)
    assert rescored == {k: record[k] for k in rescored}
    assert rescored == evaluate.score(record["completion"], prompts.to_prompt(item))
    bare = {k: v for k, v in record.items() if k not in rewards.META_COLUMNS}  # a record of the old shape
    if "choices" in columns or "precision" in columns:
        assert not evaluate.rescore(bare)["correct"]  # the columns decide the verdict: the test would catch it


def test_image_names_are_file_safe_and_distinct():
    ids = ["synthetic-0-1", "a/b", "a_b", "a b", "../../etc/passwd", "x" * 300, "12"]
    names = [image_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") for n in names)
    assert all(len(n) <= 100 for n in names)


def test_save_images_single_multi_undecoded_and_none(tmp_path, items):
    import io

    from PIL import Image

    one, two = items[0]["image"], items[1]["image"]
    png = io.BytesIO()
    two.save(png, format="PNG")
    assert [p.name for p in save_images({"id": "one", "image": one}, tmp_path)] == ["one.png"]
    multi = save_images({"id": "m/1", "images": [one, {"bytes": png.getvalue(), "path": None}]}, tmp_path)
    assert image_paths(tmp_path, "m/1") == multi and len(multi) == 2
    assert Image.open(multi[1]).convert("RGB").tobytes() == two.convert("RGB").tobytes()
    assert save_images({"id": "text-only", "image": None}, tmp_path) == []
    assert image_paths(tmp_path, "text-only") == [] and not list(tmp_path.glob("*.tmp"))
    big = Image.new("RGB", (2000, 1000), "white")
    [path] = save_images({"id": "big", "image": big}, tmp_path)
    assert Image.open(path).size == (MAX_IMAGE_SIDE, MAX_IMAGE_SIDE // 2)


# --- generation on the tiny Qwen3-VL ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tiny_dir):
    from vlrl.model.loading import load_model

    return load_model(str(tiny_dir), backend="transformers")


def eval_rows(n, seed=5):
    """TRL rows of generated items, with their metadata (vlrl.model.prompts.to_prompt does not carry it yet)."""
    import datasets

    items = synthetic.generate(n, seed=seed, image_size=64)
    return datasets.Dataset.from_list([{**prompts.to_prompt(i), "metadata": i["metadata"]} for i in items])


@pytest.mark.slow
def test_batched_generation_equals_one_at_a_time(tiny_model, tmp_path):
    model, processor = tiny_model
    rows = eval_rows(6)
    batched = evaluate.evaluate(model, processor, rows, tmp_path / "b6.jsonl", batch_size=6, max_new_tokens=32,
                                image_dir=tmp_path / "images", progress=False)
    single = evaluate.evaluate(model, processor, rows, tmp_path / "b1.jsonl", batch_size=1, max_new_tokens=32,
                               progress=False)
    assert len({r["prompt_tokens"] for r in batched}) > 1  # prompts of different lengths: left padding is exercised
    assert [r["completion"] for r in batched] == [r["completion"] for r in single]
    assert [r["finish_reason"] for r in batched] == [r["finish_reason"] for r in single]
    for row, record in zip(rows, batched):
        assert record["id"] == row["id"] and record["gold"] == row["answer"]
        assert record["question"].startswith(row["prompt"][0]["content"][1]["text"][:20])
        assert record == {**record, **evaluate.score(record["completion"], row)}  # scored by the reward code
        assert {k: record[k] for k in rewards.META_COLUMNS} == {k: row[k] for k in rewards.META_COLUMNS}
        assert record == {**record, **evaluate.rescore(record)}  # and scored again from the record alone
        assert 0 < record["completion_tokens"] <= 32 and record["finish_reason"] in ("stop", "length")
        assert record["metadata"]["task"] == row["metadata"]["task"] and "reasoning" not in record["metadata"]
        assert (record["max_new_tokens"], record["do_sample"]) == (32, False)
        [image_path] = image_paths(tmp_path / "images", row["id"])
        from PIL import Image

        assert Image.open(image_path).size == row["image"].size


@pytest.mark.slow
def test_interrupted_eval_resumes_and_skips_written_ids(tiny_model, tmp_path, monkeypatch):
    model, processor = tiny_model
    rows = eval_rows(8, seed=6)
    path = tmp_path / "eval.jsonl"
    real_decode, batches = engine.decode, []

    def interrupted(model, inputs, decoding):  # the engine, with a Ctrl-C arriving during the second batch
        batches.append(inputs["input_ids"].shape[0])
        if len(batches) == 2:
            raise KeyboardInterrupt
        return real_decode(model, inputs, decoding)

    with monkeypatch.context() as patched:
        patched.setattr(engine, "decode", interrupted)
        with pytest.raises(KeyboardInterrupt):
            evaluate.evaluate(model, processor, rows, path, batch_size=3, max_new_tokens=24, progress=False)
    assert [r["id"] for r in read_records(path)] == list(rows["id"])[:3]  # the first batch is on disk, whole
    with path.open("a") as f:  # and a kill during the next write left half a line
        f.write(json.dumps({"id": rows["id"][3], "completion": "<REASONING>x"})[:30])

    logged = []
    records = evaluate.evaluate(model, processor, rows, path, batch_size=3, max_new_tokens=24, progress=False,
                                log=logged.append)
    assert [r["id"] for r in records] == list(rows["id"])
    assert "5 items generated (3 resumed" in logged[0]
    lines = path.read_text().splitlines()
    # the torn line is gone, and no item was written twice
    assert len(lines) == 8 and [json.loads(line)["id"] for line in lines] == list(rows["id"])

    again = evaluate.evaluate(model, processor, rows, path, batch_size=3, max_new_tokens=24, progress=False,
                              log=logged.append)
    assert again == records and "0 items generated (8 resumed" in logged[1]
    with pytest.raises(EvalError, match="same settings"):  # two decoding settings never mix in one file
        evaluate.evaluate(model, processor, rows, path, batch_size=3, max_new_tokens=40, progress=False)


@pytest.mark.slow
def test_sampled_eval_draws_k_per_item_and_resumes_to_the_same_draws(tiny_model, tmp_path, monkeypatch):
    """K draws per item in the record (scored like the greedy fields), batch_size counted in sequences, and an eval
    stopped between generate calls resumes to exactly the draws of an uninterrupted one (each call is seeded from
    the eval's seed and its items' ids)."""
    model, processor = tiny_model
    rows = eval_rows(6, seed=7)
    settings = {"batch_size": 8, "max_new_tokens": 24, "samples": 4, "temperature": 1.0, "seed": 3, "progress": False}
    whole = evaluate.evaluate(model, processor, rows, tmp_path / "whole.jsonl", **settings)
    for row, record in zip(rows, whole):
        assert len(record["draws"]) == 4 and record["num_correct"] == sum(d["correct"] for d in record["draws"])
        for draw in record["draws"]:
            assert draw == {**draw, **evaluate.score(draw["completion"], row)}
        assert record["completion"] == record["draws"][0]["completion"] and record["samples"] == 4
    assert len({d["completion"] for r in whole for d in r["draws"]}) > 6  # sampled: the draws differ

    path = tmp_path / "resumed.jsonl"
    real_decode, calls = engine.decode, []

    def stopped(model, inputs, decoding):  # 8 sequences per call = 2 items x 4 draws; stopped in the second call
        calls.append(inputs["input_ids"].shape[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_decode(model, inputs, decoding)

    with monkeypatch.context() as patched:
        patched.setattr(engine, "decode", stopped)
        with pytest.raises(KeyboardInterrupt):
            evaluate.evaluate(model, processor, rows, path, **settings)
    assert calls == [8, 8] and len(read_records(path)) == 2  # two items per call, each expanded to 4 draws
    assert evaluate.evaluate(model, processor, rows, path, **settings) == whole


def test_duplicate_ids_are_refused_before_generating(tmp_path):
    rows = [{"id": "a", "prompt": [], "answer": "1"}, {"id": "a", "prompt": [], "answer": "2"}]
    with pytest.raises(EvalError, match="duplicate ids"):
        evaluate.evaluate(None, None, rows, tmp_path / "e.jsonl")


def test_eval_scores_with_the_runs_reward_set():
    # [training] reward = "symbolic" (geo3k): eval must call right what the reward paid for, and a record rescores so.
    row = {"id": "g", "question": "Find x.", "answer": "2\\sqrt{3}"}
    completion = "<REASONING>x^2 = 12</REASONING><SOLUTION>\\sqrt{12}</SOLUTION>"
    symbolic, plain = evaluate.to_record(row, completion, symbolic=True), evaluate.to_record(row, completion)
    assert (symbolic["correct"], symbolic["match"], plain["correct"]) == (True, "symbolic", False)
    assert symbolic["correctness_reward"] == rewards.symbolic_correctness_reward([completion], answer=[row["answer"]])[0]
    assert evaluate.rescore(symbolic)["correct"] and not evaluate.rescore(plain)["correct"]
