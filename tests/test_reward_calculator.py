"""The browser reward calculator (rewards/) shows exactly what vlrl.grammar.rewards computes.

The page runs vlrl's own answers.py and rewards.py through Pyodide; this file drives it in headless Chromium
(Debian's chromium + chromedriver, which `make test` installs through rewards/install.sh), types inputs, reads the
outputs and compares them with vlrl.grammar.rewards run here, on every rewards/golden/*.jsonl case, this file's own
smoke cases (tests/data/calculator_smoke.jsonl) and a fuzzed set made at test time. Nothing here hard-codes a
rule: whatever answers.py and rewards.py say, the page must say too.
Also covered: URL parameters, the EN / 中文 labels, the eval-record browser, and `vlrl serve-rewards`.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from chromium import BASE_FLAGS, find_chromium  # tests/chromium.py

from vlrl.evaluation import evaluate
from vlrl.evaluation.records import read_records
from vlrl.grammar import rewards
from vlrl.serve import make_server, page_url, serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "rewards"
FIELDS = ("completion", "answer", "question_type", "choices", "precision", "unit", "answer_type")
META = ("question_type", "choices", "precision", "unit", "answer_type")
CHROMIUM_FLAGS = [*BASE_FLAGS, "--window-size=1400,1100",
                  # Nothing may come from outside: any host name but the local server's fails to resolve.
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
FUZZ_SEED = int(os.environ.get("VLRL_FUZZ_SEED", "9"))


def unavailable(reason: str):
    """Skips off CI; on CI the browser test must run, so a missing piece fails it."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the reward calculator test (rewards/install.sh --browser installs it).")
    pytest.skip(reason)


# ---- cases: golden files + fuzz --------------------------------------------------------------------------------

SMOKE = Path(__file__).resolve().parent / "data" / "calculator_smoke.jsonl"


def golden_cases() -> list[dict]:
    """Every rewards/golden/*.jsonl case, then the smoke cases (name, completion, answer, meta, ...)."""
    cases = []
    for path in [*sorted((PAGE / "golden").glob("*.jsonl")), SMOKE]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                case = json.loads(line)
                case["name"] = f"{path.stem}:{case.get('name', number)}"
                cases.append(case)
    return cases


NUMBERS = ["7", "7.0", "-3", "+2", "0.5", ".5", "5.", "1,250", "1,25", "12,345,678.9", "1e3", "2E-2", "1e400",
           "3.14159", "3.145", "2.675", "0.125", "-0", "00012", "$5", "50%", "5$", "12 cm", "12cm", "1_000",
           "0x10", "nan", "inf", "٣", "３", "²", "12.5 %", "−3"]
LETTERS = ["A", "B", "(C)", "d.", "E", "Z", "AB", "(b)", "B)"]
WORDS = ["apples", "红色", "yes", "No", "π", "😀", "naïve", "Ⅷ", "x" * 70, "The answer is 7"]
SPACES = ["", " ", "  ", "\n", "\t", "\u00a0", "\u3000", "\u2028", "\x85", "\r\n", "\r", "\u200b"]
TAGS = ["<REASONING>", "</REASONING>", "<SOLUTION>", "</SOLUTION>", "<think>", "</think>", "<SOLUTION",
        "SOLUTION>", "<solution>", "</ SOLUTION>", "<REASONING></REASONING>"]
SPAM = ["addCriterion", "addCriterion\n", "\n\n\n", "addCriterionaddCriterion"]
CHOICES = [[], ["3", "7"], ["3", "7", "12 cm", "1,250"], ["红色", "蓝色"], [3, 7.5], ["A", "B", "C", "D", "E"]]


def fuzz_case(rng: random.Random, index: int) -> dict:
    """One random completion, gold answer and MathVista fields, mixing everything the grammar cares about."""
    value = rng.choice(NUMBERS + LETTERS + WORDS)

    def sp() -> str:
        return rng.choice(SPACES)

    shape = rng.randrange(5)
    if shape == 0:  # well formed, maybe with a think block and stray spacing
        think = f"<think>{rng.choice(NUMBERS)}{sp()}</think>" if rng.random() < 0.3 else ""
        completion = f"{think}{sp()}<REASONING>{rng.choice(WORDS)}{sp()}</REASONING>{sp()}<SOLUTION>{sp()}{value}{sp()}</SOLUTION>"
    elif shape == 1:  # any mix of pieces
        pieces = TAGS + NUMBERS + LETTERS + WORDS + SPACES + SPAM
        completion = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 14)))
    elif shape == 2:  # addCriterion degeneration around an answer
        spam = rng.choice(SPAM) * rng.randrange(1, 60)
        completion = f"<REASONING>{value}</REASONING>{spam}<SOLUTION>{value}</SOLUTION>{spam[: rng.randrange(50)]}"
    elif shape == 3:  # duplicated or unclosed blocks
        completion = rng.choice([f"<SOLUTION>{value}</SOLUTION><SOLUTION>{value}</SOLUTION>",
                                 f"<REASONING>a</REASONING><REASONING>b</REASONING><SOLUTION>{value}</SOLUTION>",
                                 f"<think>{value}<SOLUTION>{value}</SOLUTION>", f"{value}</think><SOLUTION>{value}</SOLUTION>",
                                 f"<SOLUTION>{value}", f"<SOLUTION>{value}</SOLUTION></SOLUTION>"])
    else:  # a plain answer with no tags at all, or an empty completion
        completion = rng.choice([value, "", sp()])
    meta = {}
    choices = rng.choice(CHOICES)
    if rng.random() < 0.4:
        meta["question_type"] = rng.choice(["multi_choice", "free_form", "other"])
    if rng.random() < 0.35 or meta.get("question_type") == "multi_choice":
        meta["choices"] = choices
    if rng.random() < 0.35:
        meta["precision"] = rng.choice([None, 0, 1, 2, 3, 1.0, 2.0, -1])
    if rng.random() < 0.3:
        meta["unit"] = rng.choice(["cm", "%", "°", "m^2", " cm", "厘米"])
    if rng.random() < 0.2:
        meta["answer_type"] = rng.choice(["integer", "float", "text", "list"])
    # The gold: often the same value written another way, sometimes a choice, missing or blank.
    answer = rng.choice([value, value.strip(), rng.choice(NUMBERS), rng.choice(WORDS[:7]),
                         str(rng.choice(choices)) if choices else "7", None, " "])
    if answer is not None:  # a gold answer sits in a one-line input field
        answer = answer.replace("\r", "").replace("\n", "")
    return {"name": f"fuzz-{FUZZ_SEED}-{index}", "completion": completion, "answer": answer, "meta": meta}


def fuzz_cases(n: int) -> list[dict]:
    rng = random.Random(FUZZ_SEED)
    return [fuzz_case(rng, i) for i in range(n)]


def page_fields(case: dict) -> dict:
    """The page's inputs for a case: strings; an empty field is an absent one (None)."""
    meta = case.get("meta") or {}
    fields = {"completion": case["completion"], "answer": "" if case.get("answer") is None else str(case["answer"])}
    for key in META:
        value = meta.get(key)
        if value is None:
            fields[key] = ""
        elif key in ("choices", "precision") and not isinstance(value, str):
            fields[key] = json.dumps(value, ensure_ascii=False)
        else:
            fields[key] = str(value)
    return fields


def python_says(completion: str, answer, meta: dict) -> dict:
    """What vlrl.grammar.rewards computes, as the page prints it (Python's repr)."""
    fmt = rewards.format_parts(completion)
    corr = rewards.correctness_parts(completion, answer, **meta)
    return {"format": repr(fmt["score"]), "correctness": repr(corr["score"]),
            "total": repr(rewards.total_reward(fmt["score"], corr["score"])),
            "parts": {k: repr(v) for part in (fmt, corr) for k, v in part.items() if k != "score"}}


# ---- the browser -----------------------------------------------------------------------------------------------

READ_OUTPUTS = """
const text = (id) => document.getElementById(id).textContent;
const parts = {};
for (const node of document.querySelectorAll('#format-parts [data-part], #correctness-parts [data-part]')) {
  parts[node.dataset.part] = node.textContent;
}
return {format: text('format-score'), correctness: text('correctness-score'), total: text('total-score'), parts};
"""

# Strings travel to the page as UTF-16 code units: WebDriver's JSON refuses lone surrogates, which golden cases
# hold (a JavaScript string can; so can a Python str).
DECODE = """
const decode = (units) => {
  let out = '';
  for (let i = 0; i < units.length; i += 8192) out += String.fromCharCode(...units.slice(i, i + 8192));
  return out;
};
const decodeAll = (values) => Object.fromEntries(Object.entries(values).map(([k, v]) => [k, decode(v)]));
"""

# Sets each input as typing would (value + an input event, one field at a time) and reads the outputs, and
# what the inputs now hold (a textarea turns "\r\n" into "\n").
TYPE_CASES = DECODE + """
const [cases, fields] = arguments;
return cases.map((encoded) => {
  const values = decodeAll(encoded);
  for (const f of fields) {
    const node = document.getElementById(f);
    node.value = values[f];
    node.dispatchEvent(new Event('input', {bubbles: true}));
  }
  const held = fields.map((f) => [...document.getElementById(f).value].map((c) => c.codePointAt(0)));
  return [(() => {READ_OUTPUTS})(), held];
});
""".replace("READ_OUTPUTS", READ_OUTPUTS)

LOAD_CASES = DECODE + """
const [cases] = arguments;
return cases.map((encoded) => { window.calculator.load(decodeAll(encoded)); return (() => {READ_OUTPUTS})(); });
""".replace("READ_OUTPUTS", READ_OUTPUTS)


def encoded(fields: dict) -> dict:
    """A case's fields as UTF-16 code units, for DECODE."""
    out = {}
    for key, text in fields.items():
        data = text.encode("utf-16-le", "surrogatepass")
        out[key] = [int.from_bytes(data[i:i + 2], "little") for i in range(0, len(data), 2)]
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory with real eval records, made by vlrl.evaluation.evaluate.to_record as an eval writes them."""
    run = tmp_path_factory.mktemp("run")
    rows = [("q1", "7", {}, "<REASONING>3+4</REASONING><SOLUTION>8</SOLUTION>",
             "<REASONING>3+4=7</REASONING><SOLUTION>7</SOLUTION>"),
            ("q2", "3.14", {"precision": 2.0}, "<SOLUTION>3.14159</SOLUTION>",
             "<REASONING>pi\r\nto two places</REASONING>\r\n<SOLUTION>3.14159</SOLUTION>"),
            ("q3", "7", {"question_type": "multi_choice", "choices": ["3", "7"]},
             "<REASONING>B</REASONING><SOLUTION>B</SOLUTION>", "addCriterion\n" * 30 + "<SOLUTION>A</SOLUTION>"),
            (4, "12", {"unit": "cm"}, "<REASONING>r</REASONING><SOLUTION>12 cm</SOLUTION>", None)]
    for name, column in (("eval_before.jsonl", 3), ("eval_after.jsonl", 4)):
        with (run / name).open("w", encoding="utf-8") as f:
            for row in rows:
                if row[column] is None:
                    continue
                item = {"id": row[0], "question": f"question {row[0]}", "answer": row[1], **row[2]}
                record = evaluate.to_record(item, row[column], completion_tokens=len(row[column]),
                                            finish_reason="stop")
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        if name == "eval_after.jsonl":  # a record scored under older rules, and a torn line
            with (run / name).open("a", encoding="utf-8") as f:
                f.write(json.dumps({**record, "id": "old", "reward": 9.9}) + "\n{torn line\n")
    return run


@pytest.fixture(scope="module")
def server(run_dir):
    try:
        srv = make_server(0, run_dir=run_dir, quiet=True)
    except FileNotFoundError as err:
        unavailable(str(err))
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from selenium import webdriver
    except ImportError:
        unavailable("selenium is not installed (pip install -e '.[dev]')")
    chromium = find_chromium()
    driver_path = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    if not chromium or not Path(driver_path).exists():
        unavailable("headless Chromium or chromedriver is not installed (Debian: apt-get install chromium "
                    "chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_script_timeout(120)
    yield driver
    driver.quit()


def open_page(driver, url: str, *, reuse: bool = False):
    """Loads the page and waits until Python is up (or the page says why not); `reuse` keeps a loaded page."""
    from selenium.webdriver.support.ui import WebDriverWait

    if reuse and driver.current_url.startswith(url) and driver.execute_script(
            "return document.documentElement.dataset.ready") == "true":
        return  # the tests that set every input share one page load (Pyodide takes seconds to start)
    driver.get(url)
    WebDriverWait(driver, 90).until(lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    state = driver.execute_script("return document.documentElement.dataset.ready")
    assert state == "true", driver.find_element("id", "status").text


def mismatches(cases: list[dict], shown: list[dict], expected: list[dict]) -> list[str]:
    out = []
    for case, page, python in zip(cases, shown, expected):
        if page != python:
            link = "?" + urllib.parse.urlencode({k: v for k, v in page_fields(case).items() if v},
                                                errors="surrogatepass")
            out.append(f"{case['name']}: page {page} != python {python}\n    reproduce: /rewards/{link}")
    return out


# ---- page == Python --------------------------------------------------------------------------------------------

def test_page_equals_python_on_golden_and_fuzzed_cases(browser, server):
    """Every golden case and 400 fuzzed ones, loaded as a record or a link loads them (the exact strings)."""
    open_page(browser, page_url(server))
    cases = golden_cases() + fuzz_cases(400)
    expected = [python_says(c["completion"], c.get("answer"), c.get("meta") or {}) for c in cases]
    shown = []
    for start in range(0, len(cases), 50):
        shown += browser.execute_script(LOAD_CASES, [encoded(page_fields(c)) for c in cases[start:start + 50]])
    bad = mismatches(cases, shown, expected)
    assert not bad, f"{len(bad)} of {len(cases)} cases differ (fuzz seed {FUZZ_SEED}):\n" + "\n".join(bad[:10])
    # The fuzz is no use unless it reaches every outcome: each match rule, a skip, a penalty.
    outcomes = {(e["parts"].get("match"), e["correctness"]) for e in expected}
    assert {m for m, _ in outcomes} >= {"'exact'", "'numeric'", "'none'"}
    assert any(c == "None" for _, c in outcomes) and any(float(e["format"]) < 0 for e in expected)
    # Nothing came from outside this machine: every resource the page fetched is the local server's.
    origin = page_url(server).split("/rewards/")[0]
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and all(r.startswith(origin) for r in resources), resources


def test_page_equals_python_when_inputs_change_one_by_one(browser, server):
    """The input path: each field set and its input event fired, as typing does; 150 fuzzed cases + golden."""
    open_page(browser, page_url(server), reuse=True)
    typed = [as_typed(c) for c in golden_cases() + fuzz_cases(150)]
    expected = [python_says(c["completion"], c.get("answer"), c.get("meta") or {}) for c in typed]
    shown, held = [], []
    for start in range(0, len(typed), 50):
        batch = [encoded(page_fields(c)) for c in typed[start:start + 50]]
        for outputs, values in browser.execute_script(TYPE_CASES, batch, FIELDS):
            shown.append(outputs)
            held.append({f: "".join(map(chr, v)) for f, v in zip(FIELDS, values)})
    assert held == [page_fields(c) for c in typed]  # the inputs hold what was typed
    bad = mismatches(typed, shown, expected)
    assert not bad, f"{len(bad)} of {len(typed)} cases differ (fuzz seed {FUZZ_SEED}):\n" + "\n".join(bad[:10])


def as_typed(case: dict) -> dict:
    """A case as the page's inputs hold it once typed: HTML turns "\r\n" and "\r" into "\n" in a textarea and
    drops "\r" and "\n" from a one-line input, so Python scores that text (links and records keep the exact one)."""
    def one_line(value):
        return value.replace("\r", "").replace("\n", "") if isinstance(value, str) else value

    return {**case, "completion": case["completion"].replace("\r\n", "\n").replace("\r", "\n"),
            "answer": one_line(case.get("answer")), "meta": {k: one_line(v) for k, v in (case.get("meta") or {}).items()}}


def test_vlrl_modules_the_rules_import_later_are_fetched_on_demand(browser, server):
    """rewards.py may come to import another vlrl module: the page's Python fetches it from /vlrl/ when imported."""
    open_page(browser, page_url(server), reuse=True)
    where = browser.execute_script("return window.calculator.state.python.runPython("
                                   "'import vlrl.serve; vlrl.serve.__file__')")
    assert where == "/home/pyodide/vlrl/serve.py"


def test_typing_with_the_keyboard(browser, server):
    """Real key presses into every input, for the golden cases a keyboard can type; scores update as you type."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, page_url(server), reuse=True)
    typable = [c for c in golden_cases() if len(c["completion"]) < 400 and "\r" not in c["completion"]
               and all(ord(ch) < 0xD800 or 0xE000 <= ord(ch) < 0x10000  # keys type the BMP, whole characters
                       for ch in "".join(page_fields(c).values()))][:5]
    assert typable
    for case in typable:
        fields = page_fields(case)
        for name in FIELDS:
            box = browser.find_element(By.ID, name)
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(Keys.DELETE)
            if fields[name]:
                box.send_keys(fields[name])
        shown = browser.execute_script(READ_OUTPUTS)
        assert shown == python_says(case["completion"], case.get("answer"), case.get("meta") or {}), case["name"]
    # Key by key from empty fields: the scores follow each key, and the address bar holds a link to the case.
    for name in FIELDS:
        browser.find_element(By.ID, name).send_keys(Keys.CONTROL, "a", Keys.DELETE)
    browser.find_element(By.ID, "answer").send_keys("7")
    box = browser.find_element(By.ID, "completion")
    for typed in ("<SOLUTION>7", "</SOLUTION>"):
        box.send_keys(typed)
        text = browser.execute_script("return document.getElementById('completion').value")
        assert browser.execute_script(READ_OUTPUTS) == python_says(text, "7", {})
    link = urllib.parse.urlencode({"completion": "<SOLUTION>7</SOLUTION>", "answer": "7", "lang": "en"})
    WebDriverWait(browser, 10).until(lambda d: d.current_url.endswith(f"/rewards/?{link}"))


def test_url_parameters_prefill_every_input(browser, server):
    fields = {"completion": "<think>hmm</think><REASONING>two\r\nplaces</REASONING>\r\n<SOLUTION>3.14159 cm</SOLUTION>",
              "answer": "3.14", "question_type": "free_form", "choices": '["3.14", "2.72"]', "precision": "2",
              "unit": "cm", "answer_type": "float"}
    open_page(browser, page_url(server) + "?" + urllib.parse.urlencode({**fields, "lang": "zh"}))
    values = browser.execute_script("return arguments[0].map(f => document.getElementById(f).value)", FIELDS)
    assert values == [fields[f].replace("\r\n", "\n") for f in FIELDS]  # what a textarea shows
    meta = {"question_type": "free_form", "choices": ["3.14", "2.72"], "precision": 2, "unit": "cm",
            "answer_type": "float"}
    assert browser.execute_script(READ_OUTPUTS) == python_says(fields["completion"], "3.14", meta)  # the exact text
    assert browser.execute_script("return document.documentElement.lang") == "zh-CN"
    assert browser.execute_script("return document.getElementById('total-score').textContent") == repr(
        rewards.total_reward(2.0, 1.5))
    # The share link reproduces every input, "\r\n" included.
    link = browser.execute_script("return new URL(window.calculator.shareLink(), location.href).href")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query, keep_blank_values=True)
    assert {k: v[0] for k, v in query.items()} == {**fields, "lang": "zh"}


def test_language_toggle_covers_every_label(browser, server):
    open_page(browser, page_url(server) + "?" + urllib.parse.urlencode(
        {"completion": "<REASONING>r</REASONING><SOLUTION>B</SOLUTION>", "answer": "7",
         "question_type": "multi_choice", "choices": '["3", "7"]', "precision": "x"}))
    i18n = browser.execute_script("return window.calculator.I18N")
    assert set(i18n["en"]) == set(i18n["zh"]), set(i18n["en"]) ^ set(i18n["zh"])
    labels = """return [...document.querySelectorAll('[data-i18n]')].map(n => [n.dataset.i18n, n.textContent])
      .concat([...document.querySelectorAll('[data-i18n-placeholder]')].map(n => [n.dataset.i18nPlaceholder, n.placeholder]))
      .concat([...document.querySelectorAll('table.parts th, #problems li, #status-text, #load-time')].map(n => ['', n.textContent]))"""
    english = browser.execute_script(labels)
    assert len(english) > 40
    assert all(key == "" or text == i18n["en"][key] for key, text in english)
    browser.find_element("id", "lang-toggle").click()
    chinese = browser.execute_script(labels)
    cjk = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
    untranslated = [(key, text) for key, text in chinese if not cjk.search(text)]
    assert not untranslated, f"labels without a Chinese translation (add them to I18N.zh in calculator.js): {untranslated}"
    assert all(key == "" or text == i18n["zh"][key] for key, text in chinese)
    assert browser.execute_script("return document.title") == i18n["zh"]["title"]
    browser.find_element("id", "lang-toggle").click()
    assert browser.execute_script(labels) == english
    assert "lang=en" in browser.current_url


# ---- eval records ----------------------------------------------------------------------------------------------

def test_records_from_a_run_directory_pair_by_id_and_open_in_the_calculator(browser, server, run_dir):
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, page_url(server, with_run=True))
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script("return document.documentElement.dataset.records") == "loaded")
    before, after = (read_records(run_dir / f"eval_{s}.jsonl") for s in ("before", "after"))
    ids = list(dict.fromkeys(json.dumps(r["id"]) for r in before + after))
    rows = browser.execute_script("""return [...document.querySelectorAll('#records-table tbody tr')].map(tr =>
        [tr.dataset.id, ...[...tr.querySelectorAll('td.record, td.empty')].map(td => td.dataset.side || 'none')])""")
    assert [r[0] for r in rows] == ids
    assert [r[1:] for r in rows if r[0] == "4"] == [["before", "none"]]  # only in before
    summary = browser.find_element("id", "records-summary").text
    assert f"{len(ids)} items" in summary and "1 unreadable" in summary
    stored = browser.execute_script("return [...document.querySelectorAll('td.record b.stored')].map(b => b.textContent)")
    by_id = {json.dumps(r["id"]): r for r in after}
    assert repr(by_id['"q2"']["reward"]) in stored
    # The record scored under other rules is flagged; the others agree with today's rules.
    stale = browser.execute_script("return [...document.querySelectorAll('.stale')].map(n => n.closest('tr').dataset.id)")
    assert stale == ['"old"']
    # Click q2's after-completion: its exact text (with \r\n) and its precision go into the calculator.
    browser.execute_script("""document.querySelector('tr[data-id=\\'"q2"\\'] td[data-side=after]').click()""")
    record = by_id['"q2"']
    assert browser.execute_script("return window.calculator.state.fields.completion") == record["completion"]
    assert browser.find_element("id", "precision").get_attribute("value") == "2.0"
    shown = browser.execute_script(READ_OUTPUTS)
    assert shown == python_says(record["completion"], record["gold"], {"precision": 2.0})
    assert [shown["format"], shown["correctness"], shown["total"]] == [
        repr(record["format_reward"]), repr(record["correctness_reward"]), repr(record["reward"])]


def test_records_from_the_file_picker(browser, server, run_dir):
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, page_url(server))
    picker = browser.find_element("id", "records-file")
    picker.send_keys(f"{run_dir / 'eval_before.jsonl'}\n{run_dir / 'eval_after.jsonl'}")
    WebDriverWait(browser, 30).until(
        lambda d: len(d.find_elements("css selector", "#records-table tbody tr")) == 5)
    browser.find_element("css selector", "#records-filter option[value=fixed]").click()
    rows = browser.execute_script("return [...document.querySelectorAll('#records-table tbody tr')].map(t => t.dataset.id)")
    assert rows == ['"q1"']  # q1: 8 before, 7 after, the one item training fixed


# ---- the server, the CLI, the Python half ----------------------------------------------------------------------

def test_server_serves_the_page_the_runtime_and_vlrl_sources_only(server):
    base = page_url(server).split("/rewards/")[0]

    def get(path: str):
        return urllib.request.urlopen(base + path, timeout=10)

    assert b'id="total-score"' in get("/").read()  # / redirects to the page
    assert get("/vlrl/grammar/rewards.py").read() == (Path(rewards.__file__)).read_bytes()
    assert get("/rewards/node_modules/pyodide/pyodide.asm.wasm").headers["Content-Type"] == "application/wasm"
    assert get("/run/eval_before.jsonl").read().startswith(b"{")
    for path in ("/vlrl/../pyproject.toml", "/rewards/../../etc/passwd", "/vlrl/presets/tiny.toml",
                 "/vlrl/%2e%2e/pyproject.toml", "/elsewhere"):
        with pytest.raises(urllib.error.HTTPError) as err:
            get(path)
        assert err.value.code == 404, path


def test_cli_serve_rewards(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "vlrl", "serve-rewards", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        if not line:  # its stdout closed before it printed the address: it is exiting, and poll() may not know yet
            proc.wait(timeout=30)
        if proc.poll() is not None:
            unavailable(proc.stderr.read().strip())
        url = re.search(r"http://127\.0\.0\.1:\d+/rewards/", line).group(0)
        assert b"reward calculator" in urllib.request.urlopen(url, timeout=10).read()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # A page folder without the runtime: the error says how to install it.
    (tmp_path / "index.html").write_text("<html></html>")
    out = subprocess.run([sys.executable, "-m", "vlrl", "serve-rewards", "--port", "0", "--page-dir", str(tmp_path)],
                         check=False, capture_output=True, text=True, env={**env, "VLRL_PYODIDE_DIR": ""}, timeout=60)
    assert out.returncode == 1 and f"bash {tmp_path}/install.sh" in out.stderr


def calculator_module():
    """rewards/calculator.py, the page's Python half, imported here as the page runs it (on this vlrl)."""
    spec = importlib.util.spec_from_file_location("calculator", PAGE / "calculator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_calculator_python_half_doctests():
    result = doctest.testmod(calculator_module())
    assert result.attempted > 0 and result.failed == 0


def test_calculator_rescores_eval_records_to_their_stored_rewards(run_dir):
    """What the record browser lists, without the browser: every record an eval wrote (q3 is multi-choice, answered
    by its letter) recomputes to its stored rewards; only the record scored under other rules is flagged."""
    calculator = calculator_module()
    entries = [e for side in ("before", "after")
               for e in calculator.read_records((run_dir / f"eval_{side}.jsonl").read_text(encoding="utf-8"))]
    assert [e["id"] for e in entries if "bad_line" not in e and not e["same"]] == ["old"]
    multi_choice = [e for e in entries if e.get("id") == "q3"]
    assert len(multi_choice) == 2 and all(e["fields"]["question_type"] == "multi_choice" for e in multi_choice)
    assert json.loads(multi_choice[0]["fields"]["choices"]) == ["3", "7"] and multi_choice[0]["correct"]


def test_smoke_cases_hold():
    """The smoke cases score as written (the golden files have their own test, tests/test_golden.py)."""
    for line in SMOKE.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        corr = rewards.correctness_parts(case["completion"], case["answer"], **case["meta"])
        assert rewards.format_parts(case["completion"])["score"] == case["format"], case["name"]
        assert corr["score"] == case["correctness"], case["name"]
