"""Regression tables for vlrl.grammar.answers, the one answer grammar (rewards/SPEC.md sections 1-9 and 11)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.grammar import answers, rewards

R = "<REASONING>r</REASONING>"


# --- the text of a completion -------------------------------------------------------------------------------

@pytest.mark.parametrize("completion,expected", [
    # plain strings (Unsloth's patched GRPOTrainer)
    ("<SOLUTION>3</SOLUTION>", "<SOLUTION>3</SOLUTION>"),
    # TRL conversational, content as a string or as parts
    ([{"role": "assistant", "content": "abc"}], "abc"),
    ([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
     "ab"),
    # other roles and non-text parts contribute nothing
    ([{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}], "answer"),
    ([{"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "t"}]}], "t"),
    # a message without a role, a bare content part, tuples
    ({"content": "x"}, "x"),
    ({"type": "text", "text": "y"}, "y"),
    (("a", ("b", "c")), "abc"),
    # bytes are UTF-8, bad bytes replaced
    (b"caf\xc3\xa9", "café"),
    (b"\xff3", "\ufffd3"),
    # nothing usable
    (None, ""), (3, ""), ({"role": "assistant", "content": None}, ""), ({"type": "image"}, ""), ([], ""),
])
def test_as_text(completion, expected):
    assert answers.as_text(completion) == expected


def test_as_text_survives_deep_and_self_containing_lists():
    deep = "x"
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    assert answers.as_text(deep) == ""  # beyond the nesting cap
    loop = ["a"]
    loop.append(loop)
    assert answers.as_text(loop) == "a"


# --- thinking -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("<think>hmm</think>answer", "answer"),
    ("a<think>1</think>b<think>2</think>c", "abc"),
    # unclosed: the rest is unfinished thinking
    ("answer<think>still thinking", "answer"),
    # opened by the chat template in the prompt: keep what follows the last </think>
    ("thinking</think>answer", "answer"),
    ("a</think>b</think>c", "c"),
    ("no thinking", "no thinking"),
    # tags are case-sensitive
    ("<THINK>x</THINK>y", "<THINK>x</THINK>y"),
])
def test_strip_think(text, expected):
    assert answers.strip_think(text) == expected


# --- blocks and extraction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected_blocks,expected_solution", [
    ("<SOLUTION>3</SOLUTION>", 1, "3"),
    ("<SOLUTION> 3\n</SOLUTION>", 1, "3"),
    ("<SOLUTION></SOLUTION>", 1, ""),
    ("<SOLUTION>3</SOLUTION><SOLUTION>3</SOLUTION>", 2, None),
    ("<SOLUTION>3", 0, None),
    ("</SOLUTION>3<SOLUTION>", 0, None),
    # the re.findall rule: a start tag and the first end tag after it
    ("<SOLUTION><SOLUTION>3</SOLUTION>", 1, "<SOLUTION>3"),
    ("<SOLUTION>3</SOLUTION></SOLUTION>", 1, "3"),
    ("<SOLUTION>3</SOLUTION><SOLUTION>", 1, "3"),
    # thinking is removed before extraction
    ("<think><SOLUTION>4</SOLUTION></think><SOLUTION>3</SOLUTION>", 1, "3"),
    ("<SOLUTION>3</SOLUTION><think>unfinished <SOLUTION>4</SOLUTION>", 1, "3"),
])
def test_blocks_and_extraction_agree(text, expected_blocks, expected_solution):
    scored = answers.strip_think(text)
    assert answers.count_blocks(scored, answers.SOLUTION_START, answers.SOLUTION_END) == expected_blocks
    assert answers.extract_solution(text) == expected_solution


def test_count_blocks_is_what_the_lazy_regex_counts():
    import random
    import re

    rng = random.Random(0)
    pieces = ["<SOLUTION>", "</SOLUTION>", "x", "\n", "<SOL", "UTION>"]
    pattern = re.compile("<SOLUTION>(.*?)</SOLUTION>", re.DOTALL)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert answers.count_blocks(text, "<SOLUTION>", "</SOLUTION>") == len(pattern.findall(text)), text


# --- numbers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,unit,expected", [
    # plain decimals
    ("3", None, 3.0), ("3.0", None, 3.0), ("-2", None, -2.0), ("+3", None, 3.0), (".5", None, 0.5),
    ("3.", None, 3.0), ("007", None, 7.0), ("1e3", None, 1000.0), ("2.5E-1", None, 0.25),
    # thousands separators: groups of exactly three
    ("1,250", None, 1250.0), ("1,250,000.5", None, 1250000.5), ("12,50", None, None), ("3,5", None, None),
    ("1,2500", None, None), (",250", None, None),
    # units: only the item's own
    ("12 cm", "cm", 12.0), ("12cm", "cm", 12.0), ("12 m", "cm", None), ("12 cm", None, None),
    ("cm", "cm", None), ("24 cm^2", "cm^2", 24.0), ("12", "", 12.0),
    # decorations any number may carry
    ("50%", None, 50.0), ("50 %", None, 50.0), ("50\\%", None, 50.0), ("30°", None, 30.0),
    ("30^\\circ", None, 30.0), ("30^{\\circ}", None, 30.0), ("$3$", None, 3.0), ("$5", None, 5.0),
    ("%", None, None), ("$", None, None),
    # not numbers
    ("", None, None), ("abc", None, None), ("3 apples", None, None), ("1 250", None, None),
    ("3/4", None, None), ("inf", None, None), ("nan", None, None), ("1e999", None, None), ("e5", None, None),
    (".", None, None), ("1_000", None, None), ("0x10", None, None), ("٣", None, None), ("３", None, None),
    ("3" * 101, None, None), ("- 3", None, None), ("3.0.0", None, None),
    # numbers given as numbers
    (3, None, 3.0), (2.5, None, 2.5), (float("nan"), None, None), (True, None, None), (10**400, None, None),
    (None, None, None), (["3"], None, None),
])
def test_parse_number(text, unit, expected):
    assert answers.parse_number(text, unit=unit) == expected


# --- matching -----------------------------------------------------------------------------------------------

MC = {"question_type": "multi_choice", "choices": ["3", "7", "10", "12"]}


@pytest.mark.parametrize("pred,gold,meta,expected", [
    # exact text, stripped
    ("3", "3", {}, "exact"), (" 3\n", "3", {}, "exact"), ("Yes", "Yes", {}, "exact"),
    ("yes", "Yes", {}, "none"),
    # numbers written differently
    ("3.0", "3", {}, "numeric"), ("3", "3.0", {}, "numeric"), ("1,250", "1250", {}, "numeric"),
    ("-0", "0", {}, "numeric"), ("4", "3", {}, "none"), ("3.0000001", "3", {}, "none"),
    ("1000000001", "1000000000", {}, "none"),
    # a trailing unit equal to the item's unit
    ("12 cm", "12", {"unit": "cm"}, "numeric"), ("12 m", "12", {"unit": "cm"}, "none"),
    # precision 2 rounding (Python's round on the double)
    ("3.14159", "3.14", {"precision": 2}, "numeric"), ("3.1", "3.14", {"precision": 2}, "none"),
    ("2.675", "2.67", {"precision": 2}, "numeric"), ("0.125", "0.12", {"precision": 2}, "numeric"),
    ("0.125", "0.13", {"precision": 2}, "none"),
    # precision 1 and 0 rounding
    ("0.75", "0.8", {"precision": 1}, "numeric"), ("2.5", "2", {"precision": 0}, "numeric"),
    # precision in the forms data sets store it
    ("3.14159", "3.14", {"precision": 2.0}, "numeric"), ("3.14159", "3.14", {"precision": "2"}, "numeric"),
    ("3.14159", "3.14", {"precision": float("nan")}, "none"), ("3.14159", "3.14", {"precision": "²"}, "none"),
    ("3.14159", "3.14", {"precision": True}, "none"), ("3.14159", "3.14", {"precision": [2]}, "none"),
    # multi-choice letters
    ("B", "7", MC, "choice"), ("(B)", "7", MC, "choice"), ("(b)", "7", MC, "choice"),
    ("B.", "7", MC, "choice"),
    ("(B) 7", "7", MC, "choice"), ("(B) 3", "7", MC, "none"), ("A", "7", MC, "none"), ("E", "7", MC, "none"),
    ("b", "7", MC, "none"), ("The answer is (B)", "7", MC, "none"),
    # multi-choice option text
    ("7", "7", MC, "exact"), ("3", "7", MC, "none"), ("7.0", "7", MC, "numeric"),
    ("yes", "Yes", {"question_type": "multi_choice", "choices": ["Yes", "No"]}, "choice"),
    # a bare letter wins over an option whose text is that letter, as in MathVista's scorer
    ("A", "A", {"question_type": "multi_choice", "choices": ["B", "A"]}, "none"),
    ("B", "A", {"question_type": "multi_choice", "choices": ["B", "A"]}, "choice"),
    ("A", "A", {"question_type": "multi_choice", "choices": ["A", "B"]}, "exact"),
    # gold given as a letter
    ("7", "B", {"question_type": "multi_choice", "choices": ["3", "7"]}, "choice"),
    ("7.0", "B", {"question_type": "multi_choice", "choices": ["3", "7"]}, "numeric"),
    # choices only count for multi-choice items, and only as a list of at most 26
    ("B", "7", {"question_type": "free_form", "choices": ["3", "7"]}, "none"),
    ("B", "7", {"question_type": "multi_choice", "choices": "37"}, "none"),
    ("B", "7", {"question_type": "multi_choice", "choices": []}, "none"),
    ("B", "b", {"question_type": "multi_choice", "choices": [str(i) for i in range(27)]}, "none"),
    # odd choice values
    ("B", "7", {"question_type": "multi_choice", "choices": [3, 7]}, "choice"),
    ("", "7", {"question_type": "multi_choice", "choices": [None, "7"]}, "none"),
    # integer answers are not truncated (MathVista's str(int(float(x))) would accept 3.7)
    ("3.7", "3", {"answer_type": "integer"}, "none"),
    # missing prediction or gold
    (None, "3", {}, "none"), ("3", None, {}, "none"), ("", "3", {}, "none"), ("3", "", {}, "none"),
])
def test_match_kind(pred, gold, meta, expected):
    assert answers.match_kind(pred, gold, **meta) == expected
    assert answers.is_correct(pred, gold, **meta) == (expected != "none")


# --- multi-choice answers in another notation than the option (rewards/SPEC.md section 11) -------------------
# The classes found in MathVista's published outputs (bench/results/mathvista_agreement.md), most of them real
# extractions from there. What a careful grader accepts is right when it fits exactly one option; an answer that
# also fits another option never is.

FRACTIONS = ["\\frac{2}{3}", "\\frac{1}{4}", "\\frac{1}{3}", "\\frac{1}{2}"]
TWELFTHS = ["\\frac { 5 } { 12 }", "\\frac { 12 } { 13 }", "\\frac { 17 } { 12 }", "\\frac { 12 } { 5 }"]
FIFTHS = ["\\frac{4}{5}", "\\frac{6}{5}", "\\frac{√{5}}{5}", "\\frac{2√{5}}{5}"]
METRES = ["10m", "20m", "35m", "40m"]
FOOD = ["Insects", "Hawk and snake", "Snake and raccoon", "Mouse and cricket"]
U = ["(u1, u2) = (0, 0)", "(u1, u2) = (1, 0)", "(u1, u2) = (0, 1)", "(u1, u2) = (1, 1)"]


@pytest.mark.parametrize("pred,gold,choices,expected", [
    # fraction notation: the same number
    ("1/3", "\\frac{1}{3}", FRACTIONS, "numeric"), ("(1/3)", "\\frac{1}{3}", FRACTIONS, "numeric"),
    ("1 / 3", "\\frac{1}{3}", FRACTIONS, "numeric"), ("\\dfrac{1}{3}", "\\frac{1}{3}", FRACTIONS, "numeric"),
    ("2/6", "\\frac{1}{3}", FRACTIONS, "numeric"), ("5/12", TWELFTHS[0], TWELFTHS, "numeric"),
    ("\\frac{5}{12}", TWELFTHS[0], TWELFTHS, "numeric"), ("9/5", "\\frac{9}{5}", ["\\frac{6}{5}", "\\frac{9}{5}"], "numeric"),
    ("4/3", "\\frac{4}{3}", ["\\frac{4}{3}", "0.75", "0.6", "0.8"], "numeric"),
    ("(20/7)cm", "\\frac{20}{7}cm", ["\\frac{15}{4}cm", "\\frac{20}{3}cm", "\\frac{20}{7}cm"], "numeric"),
    ("1/4", "\\frac{1}{3}", FRACTIONS, "none"),  # another option
    ("1/0", "\\frac{1}{3}", FRACTIONS, "none"), ("1/3/4", "\\frac{1}{3}", FRACTIONS, "none"),
    # decimal of a fraction option: equal as doubles
    ("0.8", "\\frac{4}{5}", FIFTHS, "numeric"), ("0.2727272727272727", "3/11", ["3/11", "8/11", "6/11", "3/5"], "numeric"),
    ("0.4166666666666667", TWELFTHS[0], TWELFTHS, "numeric"),
    ("0.4", TWELFTHS[0], TWELFTHS, "none"), ("0.27", "3/11", ["3/11", "8/11", "6/11", "3/5"], "none"),  # only rounds to it
    # decimal of an irrational option: not evaluated on MathVista
    ("2.8284271247461903", "2√{2}", ["1", "2", "2√{2}", "√{6}"], "none"),
    # unit left off: only a unit of UNITS that every option carries
    ("40", "40m", METRES, "numeric"), ("40 m", "40m", METRES, "numeric"), ("40.0", "40m", METRES, "numeric"),
    ("3.0", "3mm", ["1mm", "2mm", "3mm", "4mm"], "numeric"),
    ("4.40", "4.40米", ["3.85米", "4.00米", "4.40米", "4.50米"], "numeric"),
    ("60", "60*\\degree", ["15*\\degree", "30*\\degree", "60*\\degree"], "numeric"),
    ("[40]", "40°", ["30°", "40°", "50°", "60°"], "numeric"),
    ("20√{2}", "20√{2}海里", ["20海里", "20√{2}海里", "15海里", "20海里"], "choice"),
    ("160√{3}", "160√{3}m", ["160m", "160√{3}m", "(160-160√{3})m", "360m"], "choice"),
    ("2π", "2πcm", ["2πcm", "3πcm", "4πcm"], "choice"),
    ("35", "40m", METRES, "none"),  # another option
    ("40", "40m", ["40m", "40cm"], "none"),  # no unit every option carries: 40 m or 40 cm?
    ("40 cm", "40m", METRES, "none"),  # another unit
    ("5", "5 \\pi", ["\\frac { 3 } { 5 } \\pi", "5 \\pi", "10 \\pi"], "none"),  # a factor is no unit
    ("2", "2x", ["2x", "3x"], "none"), ("2", "2πcm", ["2πcm", "3πcm"], "none"),  # a variable, a factor
    # one-item list
    ("['Insects']", "Insects", FOOD, "choice"), ('["Insects"]', "Insects", FOOD, "choice"),
    ("[Insects]", "Insects", FOOD, "choice"), ("[14]", "14", ["2.5", "14", "15", "16"], "numeric"),
    ("['Acuminate']", "Acuminate", ["Acuminate", "Truncate", "Mucronate", "Acute"], "choice"),
    ("['Hawk and snake']", "Insects", FOOD, "none"), ("[]", "Insects", FOOD, "none"), ("['']", "Insects", FOOD, "none"),
    # several options: a hedge, wrong whatever the gold
    ("['horses', 'cats', 'bears']", "horses", ["horses", "cats", "nothing", "bears"], "none"),
    ("['Diffusion', 'PDE-Refiner']", "PDE-Refiner", ["Baseline", "Diffusion", "PDE-Refiner"], "none"),
    ("2.0, 8.0", "2", ["2", "4", "5", "7", "8"], "none"), ("B, C", "Insects", FOOD, "none"),
    ("(A) Insects, (D) Mouse and cricket", "Insects", FOOD, "none"), ("[1, 3]", "1 & 3", ["1 & 2", "1 & 3"], "none"),
    ("0.5", "\\frac{1}{2}", ["\\frac{1}{2}", "\\frac{2}{4}", "1"], "none"),  # fits two options
    ("2.00", "2", ["2", "2.0", "3"], "none"),
    # right side of an option written as an equation
    ("(0, 0)", U[0], U, "choice"), ("[(0, 0)]", U[0], U, "choice"), ("(0,0)", U[0], U, "choice"),
    ("(1, 0)", U[0], U, "none"),
    ("(0, 0)", U[0], ["(u1, u2) = (0, 0)", "(v1, v2) = (0, 0)"], "none"),  # fits both
    ("0", "x <= 0", ["x <= 0", "x >= 1"], "none"), ("x", "x = 3", ["x = 3", "x = 4"], "none"),
    # spaces and case
    ("10\\sqrt{3}", "10 \\sqrt { 3 }", ["5", "10", "10 \\sqrt { 3 }", "20"], "choice"),
    ("(0,0)", "(0, 0)", ["(0, 0)", "(-1, 0)", "(2, 0)"], "choice"),
    # near-miss text: no edit distance
    ("Adult spider population would decrease", "Adults spider population would decrease",
     ["Adult spider population would remain the same", "Adults spider population would decrease"], "none"),
    ("increase_phytoplankton", "increase in phytoplankton", ["increase in phytoplankton", "increase in fish"], "none"),
])
def test_multi_choice_other_notation(pred, gold, choices, expected):
    meta = {"question_type": "multi_choice", "choices": choices}
    assert answers.match_kind(pred, gold, **meta) == expected
    picked = answers.choice_of(pred, choices)
    assert picked == gold if expected != "none" else picked != gold


def test_answers_in_another_notation_score_as_their_kind():
    # a number written differently earns "numeric" (1.5), other notations "choice" (2.0): columns, one per row
    completions = ["<SOLUTION>1/3</SOLUTION>", "<SOLUTION>['Insects']</SOLUTION>", "<SOLUTION>0.5</SOLUTION>"]
    golds = ["\\frac{1}{3}", "Insects", "\\frac{1}{2}"]
    choices = [FRACTIONS, FOOD, ["\\frac{1}{2}", "\\frac{2}{4}"]]
    assert rewards.correctness_reward(completions, golds, question_type=["multi_choice"] * 3,
                                      choices=choices) == [1.5, 2.0, 0.0]


@pytest.mark.parametrize("text", [
    "[" * 200_000 + "]" * 200_000, "['" + "x" * 1_000_000 + "']", "\\frac{" * 100_000, "1/" * 300_000,
    "=" * 500_000, "(" + "1/2" * 200_000 + ")", " m" * 300_000 + "m",
])
def test_other_notation_takes_megabytes(text):
    # Linear scans only (no time limit asserted; a quadratic one would not finish): as prediction and as options.
    assert answers.choice_of(text, METRES) is None
    assert answers.choice_of("40", [text, text + "m", "40m"]) in (None, "40m")
    assert answers.match_kind(text, "40m", question_type="multi_choice", choices=[text + "m", "40m"]) == "none"


def test_the_answer_grammar_has_no_import_cycle():
    # values <- choices <- answers, counting imports inside functions (rewards/SPEC.md is ported from these)
    import ast
    from pathlib import Path

    def vlrl_imports(module: str) -> set[str]:
        tree = ast.parse((Path(answers.__file__).parent / f"{module}.py").read_text("utf-8"))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vlrl"):
                found.add(node.module.removeprefix("vlrl.") if node.module != "vlrl" else node.names[0].name)
            elif isinstance(node, ast.Import):
                found.update(a.name.removeprefix("vlrl.") for a in node.names if a.name.startswith("vlrl."))
        return found

    assert vlrl_imports("values") == set()
    assert vlrl_imports("choices") == {"grammar.values"}
    assert vlrl_imports("answers") == {"grammar.choices", "grammar.values", "grammar.symbolic"}
    assert vlrl_imports("symbolic") == set()


# --- symbolic equivalence (geo3k), math-verify with the gold first ------------------------------------------

@pytest.mark.parametrize("pred,gold,expected", [
    # radicals and fractions
    ("\\sqrt{12}", "2\\sqrt{3}", "symbolic"), ("2 \\sqrt 3", "2\\sqrt{3}", "symbolic"),
    ("4/3", "\\frac{4}{3}", "symbolic"), ("\\frac{8}{6}", "\\frac{4}{3}", "symbolic"),
    ("0.5", "\\frac{1}{2}", "symbolic"),
    ("$2\\sqrt{3}$", "2\\sqrt{3}", "symbolic"),
    # not equivalent
    ("3.4641", "2\\sqrt{3}", "none"), ("1.33", "\\frac{4}{3}", "none"), ("\\sqrt{13}", "2\\sqrt{3}", "none"),
    # hedges are sets, not the answer
    ("2\\sqrt{3} \\text{ or } 5", "2\\sqrt{3}", "none"), ("3, 5", "5", "none"),
    # plain numbers keep the numeric rule: no second opinion
    ("3.0", "3", "numeric"), ("4", "3", "none"),
    # too long to hand to sympy
    ("+".join(["1"] * 150), "150", "none"),
    # exact text first
    ("2\\sqrt{3}", "2\\sqrt{3}", "exact"),
])
def test_symbolic(pred, gold, expected):
    assert answers.match_kind(pred, gold, symbolic=True) == expected


def test_symbolic_is_off_by_default():
    assert answers.match_kind("\\sqrt{12}", "2\\sqrt{3}") == "none"


def test_symbolic_works_off_the_main_thread():
    # math-verify's timeouts use signal.alarm, which only the main thread may call
    import threading

    result = []
    thread = threading.Thread(
        target=lambda: result.append(answers.match_kind("\\frac{2}{4}", "0.5", symbolic=True)))
    thread.start()
    thread.join()
    assert result == ["symbolic"]


# --- gold answers must score full marks against themselves --------------------------------------------------

@pytest.mark.parametrize("gold,meta,expected_problem", [
    ("7", MC, None),
    ("B", {"question_type": "multi_choice", "choices": ["3", "7"]}, None),
    ("1.45", {"precision": 2, "answer_type": "float"}, None),
    ("A", {"question_type": "multi_choice", "choices": ["B", "A"]}, "does not score full marks"),
    (None, {}, "missing"), ("  ", {}, "missing"),
])
def test_check_gold(gold, meta, expected_problem):
    problem = answers.check_gold(gold, **meta)
    assert problem is None if expected_problem is None else expected_problem in problem


def test_synthetic_golds_score_full_marks():
    from vlrl.base import synthetic

    items = synthetic.generate(60, seed=1, image_size=32)
    for item in items:
        meta = {k: item[k] for k in ("precision", "question_type", "choices", "unit", "answer_type")}
        assert answers.check_gold(item["answer"], **meta) is None, item["id"]


# --- every public function takes any input ------------------------------------------------------------------

anything = st.recursive(
    st.one_of(st.none(), st.text(max_size=12), st.binary(max_size=8), st.integers(), st.floats(),
              st.booleans(), st.sampled_from(["", "<SOLUTION>", "</SOLUTION>", "(B)", "B", "3", "\ud800", "1/3",
                                              "\\frac{1}{3}", "['x']", "[", "40m", "x = 3", "="])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(a=anything, b=anything, c=anything)
def test_fuzz_public_functions_never_raise(a, b, c):
    assert isinstance(answers.as_text(a), str)
    assert isinstance(answers.strip_think(a), str)
    assert isinstance(answers.count_blocks(a, "<SOLUTION>", "</SOLUTION>"), int)
    assert isinstance(answers.count_blocks("<SOLUTION>x</SOLUTION>", b, c), int)
    assert answers.extract_solution(a) is None or isinstance(answers.extract_solution(a), str)
    number = answers.parse_number(a, unit=b)
    assert number is None or math.isfinite(number)
    assert answers.as_answer(a) is None or isinstance(answers.as_answer(a), str)
    assert answers.choice_of(a, b) is None or isinstance(answers.choice_of(a, b), str)
    kind = answers.match_kind(a, b, choices=c, question_type="multi_choice", precision=c, unit=c)
    assert kind in answers.MATCH_KINDS
    problem = answers.check_gold(a, choices=c, question_type="multi_choice")
    assert problem is None or isinstance(problem, str)


def test_empty_tags_count_nothing():
    assert answers.count_blocks("abc", "", "") == 0
