"""vlrl.base.synthetic: seeded, verifiable items in the canonical schema; the default tasks stay what the warm start learned."""

import pytest

from vlrl.base import synthetic
from vlrl.grammar import answers
from vlrl.model import prompts


def test_default_tasks_unchanged_for_the_warm_start():
    assert synthetic.TASKS == ("bar_value", "bar_max", "bar_sum", "bar_difference", "count", "rectangle_area")
    items = synthetic.generate(12, seed=0, image_size=64)
    assert [i["id"] for i in items[:2]] == ["synthetic-0-0", "synthetic-0-1"]
    assert [i["metadata"]["task"] for i in items[:6]] == list(synthetic.TASKS)
    for item in items:
        assert item["image"].size == (64, 64) and item["question_type"] == "free_form" and item["choices"] is None
        assert len(item["metadata"]["reasoning"]) < 40  # short: the tiny model learns to write it


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_every_task_is_verifiable(difficulty):
    items = synthetic.generate(3 * len(synthetic.ALL_TASKS), seed=difficulty, image_size=96, tasks="all",
                               difficulty=difficulty)
    assert {i["metadata"]["task"] for i in items} == set(synthetic.ALL_TASKS)
    for item in items:
        meta = {k: item[k] for k in ("precision", "question_type", "choices", "unit")}
        assert answers.parse_number(item["answer"]) is not None
        assert answers.is_correct(item["answer"], item["answer"], **meta)  # gold scores full marks against itself
        assert str(answers.parse_number(item["answer"])).removesuffix(".0") in item["metadata"]["reasoning"]
        if item["choices"]:
            assert item["question_type"] == "multi_choice" and item["answer"] in item["choices"]
            assert len(set(item["choices"])) == len(item["choices"])
            letter = "AB"[item["choices"].index(item["answer"])]
            assert answers.is_correct(letter, item["answer"], **meta)
        assert item["image"].mode == "RGB" and item["image"].size == (96, 96)


def test_answers_follow_the_task():
    for item in synthetic.generate(40, seed=5, tasks="triangle_angle", difficulty=3):
        a, b = (int(s) for s in item["metadata"]["reasoning"].split(" = ")[0].split(" - ")[1:])
        assert int(item["answer"]) == 180 - a - b and 30 <= int(item["answer"]) <= 120
    for item in synthetic.generate(20, seed=5, tasks="rectangle_perimeter"):
        assert item["unit"] == "cm" and int(item["answer"]) % 2 == 0
    for item in synthetic.generate(20, seed=5, tasks="count_squares", difficulty=3):
        assert 1 <= int(item["answer"]) <= 8


def test_seeded_and_distinct():
    a = synthetic.generate(8, seed=7, tasks="all")
    b = synthetic.generate(8, seed=7, tasks="all")
    assert [(i["question"], i["answer"], i["image"].tobytes()) for i in a] == \
        [(i["question"], i["answer"], i["image"].tobytes()) for i in b]
    assert {i["id"] for i in a}.isdisjoint(i["id"] for i in synthetic.generate(8, seed=8))


def test_items_make_trl_rows_and_datasets():
    items = synthetic.generate(len(synthetic.ALL_TASKS), image_size=32, tasks="all")
    prompt_rows = prompts.to_dataset(items)
    assert len(prompt_rows) == len(items) and prompt_rows[0]["image"].size == (32, 32)
    compare = next(r for r in prompt_rows if r["question_type"] == "multi_choice")
    assert "Choices: (A)" in compare["prompt"][0]["content"][1]["text"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="difficulty must be 1, 2 or 3"):
        synthetic.generate(1, difficulty=4)
    with pytest.raises(ValueError, match="unknown synthetic tasks"):
        synthetic.generate(1, tasks=("pie_chart",))
