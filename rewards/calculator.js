// The reward calculator's page logic: inputs, URL parameters, the EN / 中文 labels and the eval-record browser.
// Every score comes from calculator.py, which runs vlrl's own answers.py and rewards.py in Pyodide (CPython in
// WebAssembly, served from node_modules/, never from a CDN): this file computes nothing itself.

const FIELDS = ["completion", "answer", "question_type", "choices", "precision", "unit", "answer_type"];
// Preloaded in parallel: rewards.py, answers.py and the modules answers.py imports (values.py reads numbers,
// choices.py reads multi-choice options); any other vlrl module is fetched on demand by calculator.py.
const VLRL_MODULES = ["__init__", "base/__init__", "base/errors", "grammar/__init__", "grammar/values",
  "grammar/choices", "grammar/answers", "grammar/rewards"];

const I18N = {
  en: {
    title: "vlrl reward calculator",
    subtitle: "Edit a completion and watch the reward move. Every number is computed by vlrl's own answers.py and " +
      "rewards.py, running in this page.",
    copy_link: "Copy link", copied: "Link copied to the clipboard", copy_failed: "Copy this link from the address bar",
    example: "Example",
    loading: "Loading Python (Pyodide)…",
    ready: "Ready: vlrl's rewards running on Python {python} (Pyodide {pyodide})",
    load_failed: "Could not start Python: {error}. Open this page through `vlrl serve-rewards`; install its runtime " +
      "with `make calculator`.",
    inputs: "Inputs", completion: "Completion (the model's output)", insert: "Insert:",
    answer: "Gold answer", answer_placeholder: "empty = no gold answer (correctness is skipped)",
    mathvista_fields: "MathVista fields that change scoring", question_type: "Question type",
    choices: "Choices (JSON list)", precision: "Precision (decimals)", unit: "Unit", answer_type: "Answer type",
    empty_is_none: "empty = None",
    outputs: "Rewards", total: "Total reward", format: "Format reward", correctness: "Correctness reward",
    rule: "Rule (from vlrl.rewards)", how_read: "How the answers were read",
    meta_used: "MathVista fields passed to correctness",
    formula: "{fw} × format + {cw} × correctness = {total}",
    rule_untranslated: "",
    part_reasoning_blocks: "REASONING blocks found", part_solution_blocks: "SOLUTION blocks found",
    part_degeneration_ratio: "Degeneration ratio (share of addCriterion and newlines)",
    part_degenerate: "Degenerate (penalised)",
    part_prediction: "Extracted answer (inside SOLUTION)", part_match: "Match rule that fired",
    detail_prediction_number: "Prediction read as a number", detail_gold_number: "Gold answer read as a number",
    detail_details_unavailable: "Details unavailable",
    match_exact: "(the strings are equal)", match_choice: "(the option letter names the gold answer)",
    match_numeric: "(equal as numbers)", match_symbolic: "(equivalent expressions, by math-verify)",
    match_none: "(no rule matched)",
    problem_choices_not_list: "Choices must be a JSON list such as [\"3\", \"7\"]; got {value}. Correctness runs " +
      "without choices.",
    problem_precision_not_number: "Precision should be a number of decimals such as 2; got {value}. It is passed " +
      "on as text.",
    python_error: "Python raised an error (the scores above are stale):",
    records: "Eval records: before and after training",
    records_hint: "Load eval_before.jsonl and eval_after.jsonl from a run directory (or start `vlrl serve-rewards " +
      "--run DIR`). Records are paired by id; click a completion to open it in the calculator.",
    load_records: "Load records (.jsonl)", filter: "Show",
    filter_all: "all", filter_flipped: "correctness changed", filter_fixed: "wrong → correct",
    filter_broken: "correct → wrong", filter_stale: "stored reward ≠ recomputed",
    col_id: "id", col_question: "question", col_gold: "gold", col_before: "before", col_after: "after",
    records_summary: "{pairs} items ({before} before, {after} after), {shown} shown",
    bad_lines: "{count} unreadable lines skipped", records_failed: "could not load {url} ({error})",
    stored: "stored reward: ", now: "recomputed now: ",
    stale_title: "Recomputed now: {now} (stored: {stored}). The rules changed since this eval, or the record lacks " +
      "its MathVista fields.",
    open_title: "Open this completion in the calculator", correct: "correct", wrong: "wrong", truncated: "cut off",
    footer: "Computed by vlrl/grammar/answers.py and vlrl/grammar/rewards.py running in this page; nothing leaves this machine.",
    load_time: "Loaded in {seconds} s",
  },
  zh: {
    title: "vlrl 奖励计算器",
    subtitle: "编辑模型输出，观察奖励如何变化。所有数值都由 vlrl 自己的 answers.py 和 rewards.py 在本页面中计算。",
    copy_link: "复制链接", copied: "链接已复制到剪贴板", copy_failed: "请从地址栏复制此链接",
    example: "示例",
    loading: "正在加载 Python（Pyodide）…",
    ready: "就绪：vlrl 的奖励函数运行于 Python {python}（Pyodide {pyodide}）",
    load_failed: "无法启动 Python：{error}。请通过 `vlrl serve-rewards` 打开本页面；用 `make calculator` 安装运行时。",
    inputs: "输入", completion: "模型输出（completion）", insert: "插入：",
    answer: "标准答案", answer_placeholder: "留空 = 没有标准答案（跳过正确性奖励）",
    mathvista_fields: "影响评分的 MathVista 字段", question_type: "题型",
    choices: "选项（JSON 列表）", precision: "精度（小数位数）", unit: "单位", answer_type: "答案类型",
    empty_is_none: "留空 = None",
    outputs: "奖励", total: "总奖励", format: "格式奖励", correctness: "正确性奖励",
    rule: "规则（取自 vlrl.rewards）", how_read: "答案的解析方式",
    meta_used: "传给正确性奖励的 MathVista 字段",
    formula: "{fw} × 格式 + {cw} × 正确性 = {total}",
    rule_untranslated: "（英文原文，取自 docstring）",
    part_reasoning_blocks: "找到的 REASONING 块数", part_solution_blocks: "找到的 SOLUTION 块数",
    part_degeneration_ratio: "退化比例（addCriterion 与换行符所占比例）",
    part_degenerate: "判定为退化（扣分）",
    part_prediction: "提取的答案（SOLUTION 内）", part_match: "命中的匹配规则",
    detail_prediction_number: "预测按数值解析", detail_gold_number: "标准答案按数值解析",
    detail_details_unavailable: "无法显示细节",
    match_exact: "（字符串完全相同）", match_choice: "（选项字母对应标准答案）",
    match_numeric: "（数值相等）", match_symbolic: "（math-verify 判定表达式等价）",
    match_none: "（没有规则匹配）",
    problem_choices_not_list: "选项必须是 JSON 列表，例如 [\"3\", \"7\"]；当前为 {value}。正确性奖励将不使用选项。",
    problem_precision_not_number: "精度应为小数位数，例如 2；当前为 {value}。将按文本原样传入。",
    python_error: "Python 报错（上方分数未更新）：",
    records: "评测记录：训练前后对比",
    records_hint: "从运行目录加载 eval_before.jsonl 和 eval_after.jsonl（或使用 `vlrl serve-rewards --run DIR` 启动）。" +
      "记录按 id 配对；点击某条输出即可在计算器中打开。",
    load_records: "加载记录（.jsonl）", filter: "显示",
    filter_all: "全部", filter_flipped: "正确性有变化", filter_fixed: "错 → 对",
    filter_broken: "对 → 错", filter_stale: "存储的奖励 ≠ 重新计算",
    col_id: "编号", col_question: "问题", col_gold: "标准答案", col_before: "训练前", col_after: "训练后",
    records_summary: "共 {pairs} 题（训练前 {before} 条，训练后 {after} 条），显示 {shown} 题",
    bad_lines: "跳过 {count} 行无法解析的内容", records_failed: "无法加载 {url}（{error}）",
    stored: "存储的奖励：", now: "现在重新计算：",
    stale_title: "现在重新计算：{now}（存储值：{stored}）。评测之后规则有变化，或记录缺少 MathVista 字段。",
    open_title: "在计算器中打开这条输出", correct: "正确", wrong: "错误", truncated: "被截断",
    footer: "由本页面中运行的 vlrl/grammar/answers.py 和 vlrl/grammar/rewards.py 计算；数据不会离开本机。",
    load_time: "加载用时 {seconds} 秒",
  },
};

// The rules' one-line summaries come from the docstrings in vlrl/grammar/rewards.py; these are their translations. A
// docstring not listed here (the rule changed) is shown in English, marked as such.
const RULES_ZH = {
  "+1 for exactly one REASONING block, +1 for exactly one SOLUTION block, -2 for `addCriterion` spam.":
    "恰好一个 REASONING 块 +1，恰好一个 SOLUTION 块 +1，addCriterion 刷屏 −2。",
  "2.0 for an exact match with the gold answer, 1.5 for a numeric one, 0.0 otherwise, None without a gold.":
    "与标准答案完全相同得 2.0，数值相等得 1.5，否则 0.0；没有标准答案时为 None（跳过该样本）。",
  "The combined reward R = 0.3 * format + 1.0 * correctness (a skipped correctness counts 0).":
    "总奖励 R = 0.3 × 格式 + 1.0 × 正确性（跳过的正确性按 0 计）。",
  "The combined reward R = 0.3 * format + 1.0 * correctness (a skipped correctness counts 0, as in TRL).":
    "总奖励 R = 0.3 × 格式 + 1.0 × 正确性（跳过的正确性按 0 计，与 TRL 相同）。",
};

const EXAMPLE = {
  completion: "<REASONING>The bars show 3 and 4 apples, so there are 3 + 4 = 7 apples.</REASONING>\n" +
    "<SOLUTION>7.0</SOLUTION>",
  answer: "7", question_type: "free_form", choices: "", precision: "", unit: "", answer_type: "integer",
};

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = {
  lang: params.get("lang") === "zh" ? "zh" : "en",
  fields: Object.fromEntries(FIELDS.map((f) => [f, params.get(f) ?? ""])),
  result: null, error: null, python: null, calc: null, loadSeconds: null, runtime: null,
  records: { before: [], after: [], bad: 0, failures: [], loading: 0, sources: {} },
  selected: null,
};

function t(key, vars = {}) {
  const text = I18N[state.lang][key] ?? I18N.en[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (m, name) => (name in vars ? String(vars[name]) : m));
}

// ---- inputs ----------------------------------------------------------------------------------------------------

// The page keeps the exact strings it was given (URL, record, load()); an edit replaces one with the element's
// value. So a completion with "\r\n" from a record is scored as written, not as a textarea normalises it.
function showFields() {
  for (const f of FIELDS) $(f).value = state.fields[f];
}

function load(fields) {
  state.fields = Object.fromEntries(FIELDS.map((f) => [f, fields[f] == null ? "" : String(fields[f])]));
  showFields();
  update();
}

let linkTimer = null;
function update() {
  recompute();
  // The address bar follows the inputs, once typing pauses: browsers ignore bursts of replaceState calls.
  clearTimeout(linkTimer);
  linkTimer = setTimeout(() => history.replaceState(null, "", shareLink()), 300);
}

function shareLink() {
  const link = new URLSearchParams();
  for (const f of FIELDS) if (state.fields[f] !== "") link.set(f, state.fields[f]);
  link.set("lang", state.lang);
  if (params.get("records")) link.set("records", params.get("records"));
  return `${location.pathname}?${link}`;
}

// ---- scoring (Python) ------------------------------------------------------------------------------------------

function recompute() {
  if (!state.calc) return;
  try {
    state.result = JSON.parse(state.calc.calculate_json(JSON.stringify(state.fields)));
    state.error = null;
  } catch (err) {
    state.error = String(err.message ?? err);
  }
  renderResult();
}

function renderResult() {
  const r = state.result;
  $("python-error").hidden = !state.error;
  $("python-error").textContent = state.error ? `${t("python_error")}\n${state.error}` : "";
  if (!r) return;
  $("format-score").textContent = r.format;
  $("correctness-score").textContent = r.correctness;
  $("total-score").textContent = r.total;
  for (const [id, score] of [["format-score", r.format], ["correctness-score", r.correctness], ["total-score", r.total]]) {
    $(id).dataset.sign = score === "None" ? "none" : Number(score) > 0 ? "pos" : Number(score) < 0 ? "neg" : "zero";
  }
  $("formula").textContent = t("formula", { fw: r.weights[0], cw: r.weights[1], total: r.total });
  $("format-rule").textContent = rule(r.rules.format_reward);
  $("correctness-rule").textContent = rule(r.rules.correctness_reward);
  $("formula").title = rule(r.rules.total_reward);
  partsTable($("format-parts"), r.format_parts, "part_");
  partsTable($("correctness-parts"), r.correctness_parts, "part_");
  partsTable($("correctness-details"), r.details, "detail_");
  partsTable($("meta-used"), r.meta, "");
  const problems = $("problems");
  problems.replaceChildren(...r.problems.map(([key, value]) => el("li", {}, t(`problem_${key}`, { value }))));
  problems.hidden = r.problems.length === 0;
}

function rule(text) {
  if (state.lang === "en" || !text) return text;
  return RULES_ZH[text] ?? `${text} ${t("rule_untranslated")}`;
}

function partsTable(table, rows, prefix) {
  table.replaceChildren(...rows.map(([name, value]) => {
    const key = `${prefix}${name}`;
    const label = key in I18N.en ? t(key) : name; // a part added to rewards.py later shows under its own name
    const cell = el("td", {}, el("code", { "data-part": name }, value));
    const gloss = name === "match" ? I18N.en[`match_${value.replace(/'/g, "")}`] : null;
    if (gloss) cell.append(el("span", { class: "gloss" }, ` ${t(`match_${value.replace(/'/g, "")}`)}`));
    return el("tr", {}, el("th", { scope: "row" }, label), cell);
  }));
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children.filter((c) => c != null));
  return node;
}

// ---- language --------------------------------------------------------------------------------------------------

function applyLanguage() {
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  document.documentElement.dataset.lang = state.lang;
  document.title = t("title");
  for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
  for (const node of document.querySelectorAll("[data-i18n-placeholder]")) {
    node.placeholder = t(node.dataset.i18nPlaceholder);
  }
  renderStatus();
  renderResult();
  renderRecords();
  if (state.loadSeconds != null) $("load-time").textContent = t("load_time", { seconds: state.loadSeconds });
}

function renderStatus(message) {
  const status = $("status");
  if (state.python) {
    status.dataset.state = "ready";
    $("status-text").textContent = t("ready", state.runtime);
  } else if (state.loadError) {
    status.dataset.state = "failed";
    $("status-text").textContent = t("load_failed", { error: state.loadError });
  } else {
    $("status-text").textContent = t("loading");
  }
  if (message) $("status-text").textContent = message;
}

// ---- eval records ----------------------------------------------------------------------------------------------

function addRecords(side, text, source) {
  state.records.sources[side] = source;
  const entries = JSON.parse(state.calc.read_records_json(text));
  state.records[side] = entries.filter((e) => !("bad_line" in e));
  state.records.bad += entries.length - state.records[side].length;
  renderRecords();
}

function sideOf(name, index) {
  if (/after/i.test(name)) return "after";
  if (/before/i.test(name)) return "before";
  return index === 0 && state.records.before.length === 0 ? "before" : "after";
}

async function loadRecordFiles(files) {
  state.records.bad = 0;
  const list = [...files];
  for (const [i, file] of list.entries()) addRecords(sideOf(file.name, i), await file.text(), file.name);
}

async function loadRecordUrls(spec) {
  const urls = spec.split(",").flatMap((u) => (u.endsWith("/") ? [`${u}eval_before.jsonl`, `${u}eval_after.jsonl`] : [u]));
  state.records.loading = urls.length;
  document.documentElement.dataset.records = "loading";
  for (const [i, url] of urls.entries()) {
    try {
      const response = await fetch(url);
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      addRecords(sideOf(url, i), await response.text(), url.split("/").pop());
    } catch (err) {
      state.records.failures.push(t("records_failed", { url, error: err.message }));
    }
  }
  document.documentElement.dataset.records = "loaded";
  renderRecords();
}

function pairs() {
  const byId = new Map();
  for (const side of ["before", "after"]) {
    for (const entry of state.records[side]) {
      const key = JSON.stringify(entry.id);
      if (!byId.has(key)) byId.set(key, { id: entry.id, before: null, after: null });
      byId.get(key)[side] = entry;
    }
  }
  return [...byId.values()];
}

const FILTERS = {
  all: () => true,
  flipped: (p) => p.before && p.after && p.before.correct !== p.after.correct,
  fixed: (p) => p.before && p.after && !p.before.correct && p.after.correct,
  broken: (p) => p.before && p.after && p.before.correct && !p.after.correct,
  stale: (p) => (p.before && !p.before.same) || (p.after && !p.after.same),
};

function renderRecords() {
  const all = pairs();
  const shown = all.filter(FILTERS[$("records-filter").value] ?? FILTERS.all);
  const { before, after, bad, failures, sources } = state.records;
  const notes = [t("records_summary", { pairs: all.length, before: before.length, after: after.length, shown: shown.length })];
  const names = [sources.before, sources.after].filter(Boolean);
  if (names.length) notes.push(names.join(" + "));
  if (bad) notes.push(t("bad_lines", { count: bad }));
  $("records-summary").textContent = [...notes, ...failures].join(" · ");
  $("records-table").hidden = all.length === 0;
  $("records-table").tBodies[0].replaceChildren(...shown.map((p) => {
    const any = p.before ?? p.after;
    const question = any.question.length > 140 ? `${any.question.slice(0, 140)}…` : any.question;
    return el("tr", { "data-id": JSON.stringify(p.id) },
      el("td", {}, String(p.id)), el("td", { title: any.question }, question),
      el("td", {}, el("code", {}, any.fields.answer)),
      recordCell(p.before, p.id, "before"), recordCell(p.after, p.id, "after"));
  }));
}

function recordCell(entry, id, side) {
  if (!entry) return el("td", { class: "empty" }, "—");
  const [storedReward, nowReward] = [entry.stored[2], entry.now[2]];
  const verdict = entry.correct ? t("correct") : t("wrong");
  const cell = el("td", { class: `record ${entry.correct ? "ok" : "bad"}`, "data-side": side, title: t("open_title") },
    el("div", {}, el("span", { class: "verdict" }, verdict), " ",
      el("code", { class: "prediction" }, entry.prediction.length > 40 ? `${entry.prediction.slice(0, 40)}…` : entry.prediction)),
    el("div", { class: "reward" }, t("stored"), el("b", { class: "stored" }, storedReward),
      entry.finish_reason === "length" ? el("span", { class: "tag" }, ` ${t("truncated")}`) : null));
  if (!entry.same) {
    cell.append(el("div", { class: "stale", title: t("stale_title", { now: entry.now.join(" / "), stored: entry.stored.join(" / ") }) },
      `⚠ ${t("now")}${nowReward}`));
  }
  if (state.selected === `${side}:${JSON.stringify(id)}`) cell.classList.add("selected");
  cell.addEventListener("click", () => {
    state.selected = `${side}:${JSON.stringify(id)}`;
    load(entry.fields);
    renderRecords();
    $("inputs").scrollIntoView({ behavior: "smooth" });
  });
  return cell;
}

// ---- start -----------------------------------------------------------------------------------------------------

async function startPython() {
  const base = new URL(".", location.href);
  const { loadPyodide } = await import("./node_modules/pyodide/pyodide.mjs"); // a missing runtime is reported
  const indexURL = new URL("node_modules/pyodide/", base).href;
  // The standard library precompiled by install.sh starts Python about twice as fast; the sources still work.
  const precompiled = new URL("python_stdlib.pyc.zip", indexURL).href;
  let python = null;
  if ((await fetch(precompiled, { method: "HEAD" })).ok) {
    python = await loadPyodide({ indexURL, stdLibURL: precompiled }).catch((err) => {
      console.warn("the precompiled standard library failed; loading the sources", err);
      return null;
    });
  }
  python ??= await loadPyodide({ indexURL });
  const sources = await Promise.all([
    ...VLRL_MODULES.map((m) => fetchText(new URL(`../vlrl/${m}.py`, base))),
    fetchText(new URL("calculator.py", base)),
  ]);
  ["vlrl/base", "vlrl/grammar"].forEach((dir) => python.FS.mkdirTree(`/home/pyodide/${dir}`));
  VLRL_MODULES.forEach((m, i) => python.FS.writeFile(`/home/pyodide/vlrl/${m}.py`, sources[i]));
  python.FS.writeFile("/home/pyodide/calculator.py", sources[VLRL_MODULES.length]);
  python.runPython("import sys; sys.path.insert(0, '/home/pyodide'); import calculator");
  state.calc = python.pyimport("calculator");
  state.python = python;
  state.runtime = { python: python.runPython("import platform; platform.python_version()"), pyodide: python.version };
}

async function fetchText(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url.pathname}: HTTP ${response.status}`);
  return response.text();
}

function wire() {
  for (const f of FIELDS) {
    $(f).addEventListener("input", () => {
      state.fields[f] = $(f).value;
      update();
    });
  }
  $("lang-toggle").addEventListener("click", () => {
    state.lang = state.lang === "en" ? "zh" : "en";
    applyLanguage();
    history.replaceState(null, "", shareLink());
  });
  $("copy-link").addEventListener("click", async () => {
    const link = new URL(shareLink(), location.href).href;
    try {
      await navigator.clipboard.writeText(link);
      renderStatus(t("copied"));
    } catch {
      renderStatus(t("copy_failed"));
    }
    setTimeout(() => renderStatus(), 2500);
  });
  $("example").addEventListener("click", () => load(EXAMPLE));
  for (const button of document.querySelectorAll("[data-insert]")) {
    button.addEventListener("click", () => {
      const area = $("completion");
      const [start, end] = [area.selectionStart, area.selectionEnd];
      area.setRangeText(button.dataset.insert, start, end, "end");
      area.focus();
      area.dispatchEvent(new Event("input"));
    });
  }
  $("records-file").addEventListener("change", (e) => loadRecordFiles(e.target.files));
  $("records-filter").addEventListener("change", renderRecords);
}

// The test and the records browser use this; a person never needs it.
window.calculator = { load, state, shareLink, I18N };

wire();
showFields();
applyLanguage();
window.calculator.ready = startPython().then(
  () => {
    state.readyMs = performance.now(); // since navigation start: what a person waits before the first scores
    state.loadSeconds = (state.readyMs / 1000).toFixed(2);
    recompute();
    applyLanguage();
    document.documentElement.dataset.ready = "true";
    if (params.get("records")) return loadRecordUrls(params.get("records"));
  },
  (err) => {
    state.loadError = location.protocol === "file:" ? "this page was opened as a file" : String(err.message ?? err);
    renderStatus();
    document.documentElement.dataset.ready = "failed";
    console.error(err);
  },
);
