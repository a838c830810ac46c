"""The golden reward cases (rewards/golden/*.jsonl), shared with the browser reward calculator: every row
must score exactly as written, and every gold answer must score full marks against itself."""

import json
from pathlib import Path

import pytest

from vlrl.grammar import answers, rewards

GOLDEN = Path(__file__).resolve().parent.parent / "rewards" / "golden"
KEYS = {"name", "completion", "answer", "meta", "format", "correctness", "match", "prediction"}
META_KEYS = {"precision", "question_type", "choices", "unit", "answer_type"}


def golden_rows() -> list[dict]:
    return [json.loads(line) for path in sorted(GOLDEN.glob("*.jsonl"))
            for line in path.read_text("utf-8").splitlines()]


ROWS = golden_rows()


def test_golden_files_follow_the_contract():
    files = {p.name for p in GOLDEN.glob("*.jsonl")}
    assert files == {"format.jsonl", "correctness.jsonl", "mathvista.jsonl", "robustness.jsonl"}
    names = [r["name"] for r in ROWS]
    assert len(names) == len(set(names)) and len(ROWS) > 150
    for r in ROWS:
        assert {"name", "completion", "answer", "meta", "format", "correctness"} <= set(r) <= KEYS, r["name"]
        assert isinstance(r["completion"], str) and (r["answer"] is None or isinstance(r["answer"], str))
        assert isinstance(r["meta"], dict) and set(r["meta"]) <= META_KEYS, r["name"]
        assert r.get("match", "none") in ("exact", "choice", "numeric", "none"), r["name"]
    # every rule of the spec is exercised
    assert {r.get("match") for r in ROWS} >= {"exact", "choice", "numeric", "none"}
    assert {r["format"] for r in ROWS} == {-2.0, -1.0, 0.0, 1.0, 2.0}
    assert {r["correctness"] for r in ROWS} == {None, 0.0, 1.5, 2.0}


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_golden_case(row):
    fmt = rewards.format_parts(row["completion"])
    corr = rewards.correctness_parts(row["completion"], row["answer"], **row["meta"])
    assert fmt["score"] == row["format"]
    assert corr["score"] == row["correctness"]
    if "match" in row:
        assert corr["match"] == row["match"]
    if "prediction" in row:
        assert corr["prediction"] == row["prediction"]
    # the batch functions give the same numbers as the parts
    assert rewards.format_reward([row["completion"]]) == [row["format"]]
    columns = {k: [v] for k, v in row["meta"].items()}
    assert rewards.correctness_reward([row["completion"]], [row["answer"]], **columns) == [row["correctness"]]


@pytest.mark.parametrize("row", [r for r in ROWS if answers.as_answer(r["answer"])], ids=lambda r: r["name"])
def test_golden_gold_scores_full_marks_against_itself(row):
    assert answers.check_gold(row["answer"], **row["meta"]) is None
    completion = f"<REASONING>r</REASONING><SOLUTION>{row['answer']}</SOLUTION>"
    columns = {k: [v] for k, v in row["meta"].items()}
    assert rewards.correctness_reward([completion], [row["answer"]], **columns) == [2.0]


def test_spec_rounding_port_is_pythons_round():
    # rewards/SPEC.md gives JavaScript for Python's round(); the browser calculator copies it, so run it.
    import random
    import re
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the SPEC's JavaScript rounding port is not checked")
    js = re.search(r"```js\n(.*?)```", (GOLDEN.parent / "SPEC.md").read_text("utf-8"), re.DOTALL).group(1)
    rng = random.Random(0)
    cases = [(rng.uniform(-1000, 1000), rng.randint(0, 15)) for _ in range(2000)]
    cases += [(float(f"{rng.uniform(-100, 100):.{rng.randint(0, 5)}f}"), rng.randint(0, 6))
              for _ in range(2000)]
    cases += [(rng.randint(-10**6, 10**6) / 2 ** rng.randint(0, 12), rng.randint(0, 6))  # exact ties
              for _ in range(2000)]
    cases += [(x, n) for x in (0.125, 2.675, 3.145, 2.5, -0.125, 5e-324, 1e300, -0.0) for n in (0, 1, 2, 15)]
    script = js + (";const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
                   "console.log(JSON.stringify(cases.map(([x, n]) => pyRound(x, n))));")
    out = subprocess.run([node, "-e", script], input=json.dumps(cases), capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == [round(x, n) for x, n in cases]
