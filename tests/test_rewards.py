"""vlrl.grammar.rewards as a trainer calls it: both completion forms, the columns TRL passes, logging, names, and no
input that makes a reward raise (hypothesis fuzz)."""

import json
import math
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlrl.base.errors import DataError
from vlrl.grammar import answers, rewards

GOLDEN = Path(__file__).resolve().parent.parent / "rewards" / "golden"
GOOD = "<REASONING>4 - 1 = 3</REASONING><SOLUTION>3</SOLUTION>"


def conversational(text: str) -> list:
    return [{"role": "assistant", "content": text}]


def conversational_parts(text: str) -> list:
    half = len(text) // 2
    parts = [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}]
    return [{"role": "assistant", "content": parts}]


# --- the combined reward ------------------------------------------------------------------------------------

def test_weights_match_the_reward_functions():
    assert rewards.REWARD_WEIGHTS == [0.3, 1.0]
    assert len(rewards.REWARD_FUNCS) == len(rewards.REWARD_WEIGHTS)
    assert [f.__name__ for f in rewards.REWARD_FUNCS] == ["format_reward", "correctness_reward"]


@pytest.mark.parametrize("format_score,correctness_score,expected", [
    (2.0, 2.0, 2.6), (2.0, 1.5, 2.1), (2.0, 0.0, 0.6), (-2.0, 0.0, -0.6), (1.0, None, 0.3), (0.0, 2.0, 2.0),
])
def test_total_reward(format_score, correctness_score, expected):
    assert rewards.total_reward(format_score, correctness_score) == expected


# --- what a trainer passes ----------------------------------------------------------------------------------

def test_trl_names_and_pickles_the_rewards():
    from trl.trainer.utils import get_callable_name

    names = [get_callable_name(f) for f in rewards.reward_funcs(symbolic=True)]
    assert names == ["format_reward", "symbolic_correctness_reward"]
    for func in rewards.reward_funcs(symbolic=True):  # multiprocess data loaders and accelerate pickle them
        assert pickle.loads(pickle.dumps(func)) is func


def test_rewards_on_a_real_dataset_as_trl_passes_it():
    # The columns exactly as TRL's GRPOTrainer hands them to reward functions, from prompts.to_dataset rows.
    from vlrl.base import synthetic
    from vlrl.model import prompts

    rows = synthetic.generate(12, seed=3, image_size=32)
    dataset = prompts.to_dataset(rows)
    inputs = [dataset[i] for i in range(len(dataset))]
    keys = [k for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")]
    kwargs = {k: [example[k] for example in inputs] for k in keys}
    logged = {}
    kwargs.update(trainer_state=object(), log_extra=lambda column, values: None,
                  log_metric=lambda name, value: logged.setdefault(name, value))
    completions = [conversational(f"<REASONING>r</REASONING><SOLUTION>{row['answer']}</SOLUTION>")
                   for row in rows]
    prompts = [example["prompt"] for example in inputs]
    for func in rewards.REWARD_FUNCS:
        scores = func(prompts=prompts, completions=completions, completion_ids=[[1]] * len(rows), **kwargs)
        assert scores == [2.0] * len(rows)
    assert logged == {"format/degenerate_rate": 0.0, "correctness/skipped_rate": 0.0}


def test_string_and_conversational_completions_score_the_same():
    rows = [json.loads(line) for path in sorted(GOLDEN.glob("*.jsonl"))
            for line in path.read_text("utf-8").splitlines()]
    for form in (conversational, conversational_parts):
        completions = [form(r["completion"]) for r in rows]
        answer = [r["answer"] for r in rows]
        meta = {k: [r["meta"].get(k) for r in rows] for k in rewards.META_COLUMNS}
        assert rewards.format_reward(completions) == [r["format"] for r in rows]
        assert rewards.correctness_reward(completions, answer, **meta) == [r["correctness"] for r in rows]


def test_log_metric_reports_degeneration_and_skips():
    logged = []
    completions = [GOOD, "addCriterion\n" * 10, GOOD, "<SOLUTION>3</SOLUTION>"]
    rewards.format_reward(completions, log_metric=lambda name, value: logged.append((name, value)))
    rewards.correctness_reward(completions, answer=["3", "3", None, None],
                               log_metric=lambda name, value: logged.append((name, value)))
    assert logged == [("format/degenerate_rate", 0.25), ("correctness/skipped_rate", 0.5)]


def test_columns_broadcast_and_short_columns_fail_loudly():
    # A scalar column applies to every completion.
    three, four, pi, b = ("<SOLUTION>3</SOLUTION>", "<SOLUTION>4</SOLUTION>", "<SOLUTION>3.14159</SOLUTION>",
                          "<SOLUTION>B</SOLUTION>")
    assert rewards.correctness_reward([three, four], answer="3") == [2.0, 0.0]
    assert rewards.correctness_reward([pi, pi], answer=["3.14", "3.14"], precision=2) == [1.5, 1.5]
    # A column that does not line up with the completions would pair answers with the wrong completions: an error
    # naming the column (it used to turn the rest into silent skips), as TRL itself fails.
    with pytest.raises(DataError, match="'answer' column has 1 values for 2 completions"):
        rewards.correctness_reward([pi, pi], answer=["3.14"], precision=2)
    with pytest.raises(DataError, match="'choices' column has 1 values for 2 completions"):
        rewards.correctness_reward([b, b], answer=["7", "7"], question_type="multi_choice", choices=[["3", "7"]])


def test_symbolic_correctness_reward():
    completions = ["<SOLUTION>\\frac{2\\sqrt{3}}{2}</SOLUTION>", "<SOLUTION>1.732</SOLUTION>",
                   "<SOLUTION>7</SOLUTION>"]
    answer = ["\\sqrt{3}", "\\sqrt{3}", "7"]
    assert rewards.symbolic_correctness_reward(completions, answer) == [1.5, 0.0, 2.0]
    assert rewards.correctness_reward(completions, answer) == [0.0, 0.0, 2.0]


@pytest.mark.parametrize("completions,expected", [
    (None, []), ("<SOLUTION>3</SOLUTION>", [1.0]), ({"role": "assistant", "content": GOOD}, [2.0]),
    ((GOOD, GOOD), [2.0, 2.0]), (iter([GOOD]), [2.0]), (3, [0.0]),
])
def test_odd_batches(completions, expected):
    assert rewards.format_reward(completions) == expected


# --- never raise, linear time -------------------------------------------------------------------------------

TAGS = ["<REASONING>", "</REASONING>", "<SOLUTION>", "</SOLUTION>", "<think>", "</think>", "addCriterion",
        "\n", "(B)", "B", "3", "3.0", "1,250", " cm", "%", "$", "\\sqrt{3}", "\\frac{1}{2}", "\ud800",
        "\udfff", "\x00"]
text = st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=8)), max_size=20).map("".join)
leaf = st.one_of(text, st.none(), st.binary(max_size=16), st.integers(), st.floats(), st.booleans())
completion = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.fixed_dictionaries({"role": st.sampled_from(["assistant", "user", None, 3]), "content": inner}),
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": inner}),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=12,
)
value = st.one_of(st.none(), text, st.integers(), st.floats(), st.booleans(), st.binary(max_size=8),
                  st.lists(st.one_of(st.none(), text, st.integers()), max_size=30))
meta = st.fixed_dictionaries({
    "precision": st.one_of(value, st.integers(-5, 20), st.sampled_from(["2", "²", "-1"])),
    "question_type": st.one_of(st.sampled_from(["multi_choice", "free_form"]), value),
    "choices": st.one_of(value, st.lists(st.one_of(text, st.sampled_from(["3", "A", "B", "Yes"])),
                                         max_size=5)),
    "unit": st.one_of(value, st.sampled_from(["cm", "", " cm^2 "])),
    "answer_type": value,
})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completions=st.lists(completion, max_size=4), answer=value, meta=meta, symbolic=st.booleans())
def test_fuzz_rewards_never_raise(completions, answer, meta, symbolic):
    formats = rewards.format_reward(completions)
    columns = {k: [v] * len(completions) for k, v in meta.items()}
    answers_column = [answer] * len(completions)
    correctness = rewards.reward_funcs(symbolic=symbolic)[1](completions, answers_column, **columns)
    assert len(formats) == len(correctness) == len(completions)
    assert all(f in (-2.0, -1.0, 0.0, 1.0, 2.0) for f in formats)
    missing = not answers.as_answer(answer)
    for c in correctness:
        assert c is None if missing else (c in (0.0, 1.5, 2.0) and math.isfinite(c))
    for c in completions:  # the parts behind the numbers agree with them
        fmt = rewards.format_parts(c)
        assert (fmt["solution_blocks"] == 1) == (answers.extract_solution(c) is not None)
        assert 0.0 <= fmt["degeneration_ratio"] <= 1.0


@settings(max_examples=300, deadline=None)
@given(pred=value, gold=value, meta=meta, symbolic=st.booleans())
def test_fuzz_match_kind_never_raises(pred, gold, meta, symbolic):
    assert answers.match_kind(pred, gold, symbolic=symbolic, **meta) in answers.MATCH_KINDS


@settings(max_examples=300, deadline=None)
@given(gold=st.one_of(text, st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
       precision=st.one_of(st.none(), st.integers(0, 6)), unit=st.sampled_from([None, "cm"]))
def test_fuzz_free_form_golds_score_full_marks_against_themselves(gold, precision, unit):
    unwritable = ("</SOLUTION>", "<think>", "</think>")  # a gold holding these cannot sit in a SOLUTION block
    if not answers.as_answer(gold) or any(tag in str(gold) for tag in unwritable):
        return
    completion = f"<REASONING>r</REASONING><SOLUTION>{answers.as_answer(gold)}</SOLUTION>"
    assert rewards.correctness_reward([completion], [gold], precision=[precision], unit=[unit]) == [2.0]


@settings(max_examples=200, deadline=None)
@given(body=text)
def test_fuzz_string_and_conversational_agree(body):
    expected_format = rewards.format_reward([body])
    expected_correctness = rewards.correctness_reward([body], ["3"])
    for form in (conversational, conversational_parts):
        assert rewards.format_reward([form(body)]) == expected_format
        assert rewards.correctness_reward([form(body)], ["3"]) == expected_correctness


@pytest.mark.parametrize("completion", [
    "<SOLUTION>" * 40000,
    "</SOLUTION>" * 40000,
    "<REASONING>" * 40000 + "<SOLUTION>3",
    "<think>" * 40000,
    "</think>" * 40000,
    "<SOLUTION>" + "9" * 1_000_000 + "</SOLUTION>",
    "<SOLUTION>" + "1" + ",000" * 250_000 + "</SOLUTION>",
    "<SOLUTION>" + " " * 1_000_000 + "3" + " " * 1_000_000 + "</SOLUTION>",
    "<SOLUTION>(B" + ")" * 1_000_000 + "</SOLUTION>",
    "addCriterion\n" * 100_000,
    "<SOLUTION>3</SOLUTION>" * 50_000,
], ids=lambda c: f"{c[:14]!r}x{len(c)}")
def test_megabyte_adversarial_completions(completion):
    # No time limit is asserted (speed lives in bench/); a quadratic scan would not finish here.
    meta = {"question_type": "multi_choice", "choices": ["3", "7"], "precision": 2, "unit": "cm"}
    assert len(rewards.format_reward([completion])) == 1
    for func in rewards.reward_funcs(symbolic=True):
        assert len(func([completion], answer=["3"], **{k: [v] for k, v in meta.items()})) == 1
