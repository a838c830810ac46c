"""The report of a run: plots (PNG, matplotlib) and one self-contained `report.html` that reads from the run
directory alone.

    vlrl report runs/demo     # -> runs/demo/report.html and runs/demo/plots/{comparison,training}.png

The page holds the resolved config, the data report, the training curves, the before/after comparison with its
statistics, and every flipped item (correctness, then format) with its image, question, gold answer and both
completions. Images are embedded
as data URIs and a Content-Security-Policy forbids every other source, so the file opens offline, from anywhere.

The same pieces, and a few more, render inline in a notebook (the walkthrough's views): `items_html` (data items with
their images and prompts), `completion_html` (one completion's reward, part by part), `records_html`,
`comparison_html`, `flips_html`, `files_html` (an export and its checks) and `table_html`, each returning `Html`.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path

from vlrl import evaluate, prompts

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"  # no script, no network: the page is the data
EMBED_MAX_SIDE = 512  # flipped items' images are shrunk to this side in the page (the files keep their size)
REWARD_PREFIX, REWARD_SUFFIX = "rewards/", "/mean"


# --- plots -------------------------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(comparison: dict, path: str | Path) -> Path:
    """Accuracy and format compliance before/after as bars with their 95% Wilson intervals; McNemar p in the title.

    Args:
        comparison: what `vlrl.evaluate.compare` returns.
        path: the PNG to write.
    """
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    width = 0.36
    for offset, side, color in ((-width / 2, "before", "#9aa5b1"), (width / 2, "after", "#2f6fb0")):
        values, low, high = [], [], []
        for metric in ("accuracy", "format"):
            value = comparison[f"{metric}_{side}"] or 0.0
            lo, hi = comparison[f"{metric}_{side}_ci95"]
            values.append(value)
            low.append(value - lo)
            high.append(hi - value)
        xs = [i + offset for i in range(2)]
        ax.bar(xs, values, width, color=color, label=side, yerr=[low, high], capsize=4, ecolor="#333")
        for x, v, h in zip(xs, values, high):
            ax.text(x + width / 8, v + h + 0.01, f"{v:.0%}", ha="left", va="bottom", fontsize=8)
    ax.set_xticks([0, 1], ["accuracy", "format compliance"])
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(f"share of {comparison['n_paired']} paired items")
    ax.set_title(f"before -> after, 95% Wilson intervals; McNemar exact p = {comparison['mcnemar_p']:.3g} (accuracy), "
                 f"{comparison['format_mcnemar_p']:.3g} (format)", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def training_series(log: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """Metric name -> (steps, values) from train_log.jsonl rows, for the metrics the training plot draws.

    >>> training_series([{"step": 1, "reward": 0.3, "rewards/format_reward/mean": 1.0}, {"step": 2, "train_loss": 0}])
    {'reward': ([1], [0.3]), 'rewards/format_reward/mean': ([1], [1.0])}
    """
    wanted = lambda key: (key == "reward" or (key.startswith(REWARD_PREFIX) and key.endswith(REWARD_SUFFIX))
                          or key.startswith("completions/") or "degenera" in key)
    series: dict[str, tuple[list, list]] = {}
    for row in log:
        for key, value in row.items():
            if wanted(key) and isinstance(value, (int, float)) and "step" in row:
                steps, values = series.setdefault(key, ([], []))
                steps.append(row["step"])
                values.append(value)
    return series


def plot_training(log: list[dict], path: str | Path) -> Path | None:
    """Reward components, completion length and degeneration over training steps; None when nothing was logged.

    Args:
        log: train_log.jsonl rows (TRL's logged metrics with their `step`).
        path: the PNG to write.
    """
    series = training_series(log)
    if not series:
        return None
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (rewards_ax, length_ax, degen_ax) = plt.subplots(1, 3, figsize=(12, 3.4), dpi=110)
    for key in sorted(k for k in series if k.startswith(REWARD_PREFIX)):
        rewards_ax.plot(*series[key], marker=".", label=key[len(REWARD_PREFIX):-len(REWARD_SUFFIX)])
    if "reward" in series:
        rewards_ax.plot(*series["reward"], marker=".", color="black", label="total (weighted)")
    rewards_ax.set_title("reward (mean per step)", fontsize=9)
    if "completions/mean_length" in series:
        steps, mean = series["completions/mean_length"]
        length_ax.plot(steps, mean, marker=".", label="mean")
        if "completions/min_length" in series and "completions/max_length" in series:
            length_ax.fill_between(series["completions/min_length"][0], series["completions/min_length"][1],
                                   series["completions/max_length"][1], alpha=0.2, label="min-max")
    length_ax.set_title("completion length (tokens)", fontsize=9)
    degen_keys = [k for k in series if "degenera" in k]
    for key in degen_keys:
        degen_ax.plot(*series[key], marker=".", color="#b03030", label=key)
    if "completions/clipped_ratio" in series:
        degen_ax.plot(*series["completions/clipped_ratio"], marker=".", color="#888", label="hit max length")
    if not degen_keys:
        degen_ax.text(0.02, 0.97, "degeneration rate: not in train_log.jsonl", ha="left", va="top",
                      transform=degen_ax.transAxes, fontsize=7, color="#b03030")
    degen_ax.set_ylim(-0.05, 1.05)
    degen_ax.set_title("degenerate / truncated share", fontsize=9)
    from matplotlib.ticker import MaxNLocator

    for ax in (rewards_ax, length_ax, degen_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --- the page ----------------------------------------------------------------------------------------------------

def _data_uri(path: Path, max_side: int | None = None) -> str:
    data = path.read_bytes()
    if max_side:
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        if max(image.size) > max_side:
            image.thumbnail((max_side, max_side))
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            data = buffer.getvalue()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def _flatten(data, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(data, dict) and data:
        return [row for k, v in data.items() for row in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    text = json.dumps(data)
    return [(prefix, text if len(text) < 300 else text[:300] + " ...")]


def _table(header: list[str] | None, rows: list[list[str]], cls: str = "") -> str:
    head = "<thead><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}">{head}<tbody>{body}</tbody></table>'


def _ids(ids: list) -> str:
    return f" ({_e(', '.join(map(str, ids)))})" if ids else ""


def _comparison_html(c: dict) -> str:
    rows = []
    for metric, label, p in (("accuracy", "accuracy", c["mcnemar_p"]), ("format", "format compliance",
                                                                            c["format_mcnemar_p"])):
        cells = [label]
        for side in ("before", "after"):
            low, high = c[f"{metric}_{side}_ci95"]
            cells.append(f"{_pct(c[f'{metric}_{side}'])} <span class=ci>[{low:.1%}, {high:.1%}]</span>")
        delta = c.get(f"{metric}_delta")
        cells += ["n/a" if delta is None else f"{delta:+.1%}", _num(p)]
        rows.append(cells)
    for key, label in (("reward", "reward (mean)"), ("format_reward", "format reward (mean)"),
                       ("correctness_reward", "correctness reward (mean)"),
                       ("completion_tokens", "completion tokens (mean)"), ("degenerate_rate", "degenerate share"),
                       ("truncated_rate", "hit max_new_tokens")):
        name = key if key.endswith("_rate") else f"{key}_mean"
        before, after = c.get(f"{name}_before"), c.get(f"{name}_after")
        fmt = _pct if key.endswith("_rate") else _num
        rows.append([label, fmt(before), fmt(after), "", ""])
    out = [_table(["", "before", "after", "change", "McNemar exact p"], rows, "stats")]
    t = c["table"]
    out.append("<p>Paired 2&times;2 table of correctness (the McNemar test uses only the discordant cells):</p>")
    out.append(_table(["", "right after", "wrong after"],
                      [["<b>right before</b>", str(t["both_right"]), str(t["right_to_wrong"])],
                       ["<b>wrong before</b>", str(t["wrong_to_right"]), str(t["both_wrong"])]], "small"))
    out.append(f"<p>Format flips: {len(c['format_gained'])} gained{_ids(c['format_gained'])}, "
               f"{len(c['format_lost'])} lost{_ids(c['format_lost'])}.</p>")
    if c["only_before"] or c["only_after"]:
        out.append(f'<p class=warn>Unpaired items, left out of the statistics: {len(c["only_before"])} only before'
                   f'{_ids(c["only_before"])}, {len(c["only_after"])} only after{_ids(c["only_after"])}.</p>')
    for key, groups in (c.get("breakdown") or {}).items():
        rows = [[_e(value), str(g["n"]), _pct(g["accuracy_before"]), _pct(g["accuracy_after"]),
                 str(g["wrong_to_right"]), str(g["right_to_wrong"]), _num(g["mcnemar_p"])]
                for value, g in groups.items()]
        out.append(f"<h3>By {_e(key)}</h3>")
        out.append(_table([_e(key), "items", "accuracy before", "accuracy after", "wrong&rarr;right",
                           "right&rarr;wrong", "McNemar p"], rows, "small"))
    return "\n".join(out)


def _completion_html(label: str, record: dict | None) -> str:
    if record is None:
        return f"<div class=side><h4>{label}</h4><p class=warn>no record</p></div>"
    verdict = "right" if record.get("correct") else "wrong"
    prediction = "(no single SOLUTION block)" if record.get("prediction") is None else record["prediction"]
    return (f'<div class="side {verdict}"><h4>{label}: {verdict}, prediction <code>{_e(prediction)}'
            f'</code></h4><pre>{_e(record.get("completion"))}</pre>'
            f'<p class=meta>reward {_e(record.get("reward"))}, format {"ok" if record.get("format_ok") else "not ok"}, '
            f'{_e(record.get("completion_tokens"))} tokens, finish {_e(record.get("finish_reason"))}</p></div>')


def _flip_html(item_id, before: dict, after: dict, image_dir: Path) -> str:
    images = evaluate.image_paths(image_dir, item_id)
    pictures = "".join(f'<img alt="image of {_e(item_id)}" src="{_data_uri(p, EMBED_MAX_SIDE)}">' for p in images)
    if not images:
        pictures = "<p class=warn>image not saved in eval_images/</p>"
    record = before or after
    return (f'<div class=item><h3>{_e(item_id)}</h3><div class=row><div class=pic>{pictures}</div>'
            f'<div class=qa><p><b>Question</b></p><pre>{_e(record.get("question"))}</pre>'
            f'<p><b>Gold</b> <code>{_e(record.get("gold"))}</code></p></div></div>'
            f'<div class=row>{_completion_html("before", before)}{_completion_html("after", after)}</div></div>')


def _verdict(c: dict) -> str:
    significant = c["mcnemar_p"] < 0.05
    return (f"Accuracy {_pct(c['accuracy_before'])} &rarr; {_pct(c['accuracy_after'])} on {c['n_paired']} paired "
            f"items: {len(c['wrong_to_right'])} wrong&rarr;right, {len(c['right_to_wrong'])} right&rarr;wrong, "
            f"McNemar exact p = {_num(c['mcnemar_p'])}: "
            + ("<b>a real change</b> at the 0.05 level." if significant else
               "<b>not distinguishable from noise</b> at the 0.05 level."))


def _flips(c: dict, before: dict, after: dict, image_dir: Path, limit: int | None = None) -> list[str]:
    """Every flipped item (correctness, then format), each group under its heading; `limit` items per group."""
    out = []
    shown = set(c["wrong_to_right"] + c["right_to_wrong"])  # a format flip that is also a correctness flip: once
    for title, ids in (("Wrong &rarr; right", c["wrong_to_right"]), ("Right &rarr; wrong", c["right_to_wrong"]),
                       ("Format gained (correctness unchanged)", [i for i in c["format_gained"] if i not in shown]),
                       ("Format lost (correctness unchanged)", [i for i in c["format_lost"] if i not in shown])):
        out.append(f"<h3>{title} ({len(ids)})</h3>")
        out += [_flip_html(i, before.get(i), after.get(i), image_dir) for i in ids[:limit]] or ["<p>none</p>"]
        if limit is not None and len(ids) > limit:
            out.append(f"<p class=meta>... and {len(ids) - limit} more in report.html</p>")
    return out


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
pre { background: #f6f7f9; padding: .6em; white-space: pre-wrap; word-break: break-word; margin: .3em 0; }
table { border-collapse: collapse; margin: .6em 0; } td, th { border: 1px solid #ddd; padding: .25em .6em; }
th { background: #f0f2f5; text-align: left; } .ci { color: #777; font-size: 90%; } .warn { color: #b03030; }
.verdict { font-size: 110%; padding: .6em; background: #eef4fb; border-left: 4px solid #2f6fb0; }
img { max-width: 100%; } .plot { max-width: 100%; border: 1px solid #eee; }
.item { border: 1px solid #ddd; padding: .6em; margin: 1em 0; } .row { display: flex; gap: 1em; }
.pic { flex: 0 0 220px; } .pic img { width: 220px; image-rendering: pixelated; border: 1px solid #ccc; }
.qa, .side { flex: 1; min-width: 0; } .side h4 { margin: .3em 0; } .right h4 { color: #1d7a33; }
.wrong h4 { color: #b03030; } .meta { color: #666; font-size: 90%; margin: 0; }
"""


def render(run_dir: str | Path, *, log=None) -> Path:
    """Writes `plots/*.png` and `report.html` into the run directory; returns the report's path.

    Reads config.toml, data_report.json, train_log.jsonl, eval_before.jsonl, eval_after.jsonl and eval_images/;
    the comparison is computed from the records (and saved as comparison.json when that is missing). Any other
    missing file becomes a note in the page.
    """
    run_dir = Path(run_dir)
    before_path, after_path = run_dir / "eval_before.jsonl", run_dir / "eval_after.jsonl"
    if not before_path.exists() or not after_path.exists():
        raise FileNotFoundError(f"{run_dir} has no eval_before.jsonl / eval_after.jsonl: a report needs both evals "
                                "(vlrl run writes them; vlrl eval writes one at a time).")
    before = {r["id"]: r for r in evaluate.read_records(before_path)}
    after = {r["id"]: r for r in evaluate.read_records(after_path)}
    # From the records, the source of truth (comparison.json is their summary, written by vlrl run / vlrl compare).
    comparison = evaluate.compare(list(before.values()), list(after.values()))
    if not (run_dir / "comparison.json").exists():
        (run_dir / "comparison.json").write_text(json.dumps(comparison, indent=2))
    plots = run_dir / "plots"
    comparison_png = plot_comparison(comparison, plots / "comparison.png")
    train_log = evaluate.read_records(run_dir / "train_log.jsonl")
    training_png = plot_training(train_log, plots / "training.png")

    config_text = (run_dir / "config.toml").read_text() if (run_dir / "config.toml").exists() else None
    data_report = (json.loads((run_dir / "data_report.json").read_text())
                   if (run_dir / "data_report.json").exists() else None)
    name = run_dir.name
    if config_text:
        first = next((line for line in config_text.splitlines() if line.startswith("name =")), None)
        name = first.split("=", 1)[1].strip().strip('"') if first else name
    c = comparison
    flips = _flips(c, before, after, run_dir / "eval_images")
    sections = [
        f"<h1>vlrl run: {_e(name)}</h1><p class=meta>{_e(run_dir.resolve())}</p>",
        f"<p class=verdict>{_verdict(c)}</p>",
        "<h2>Comparison</h2>", f'<img class=plot alt="before/after" src="{_data_uri(comparison_png)}">',
        _comparison_html(c),
        "<h2>Training curves</h2>",
        (f'<img class=plot alt="training curves" src="{_data_uri(training_png)}">' if training_png
         else "<p class=warn>no train_log.jsonl metrics in this run directory</p>"),
        "<h2>Flipped items</h2>", *flips,
        "<h2>Data</h2>",
        (_table(None, [[_e(k), f"<code>{_e(v)}</code>"] for k, v in _flatten(data_report)], "small")
         if data_report else "<p class=warn>no data_report.json</p>"),
        "<h2>Resolved config</h2>",
        f"<pre>{_e(config_text)}</pre>" if config_text else "<p class=warn>no config.toml</p>",
    ]
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>vlrl report: {_e(name)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(sections) + "\n</body></html>\n")
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    if log is not None:
        log(f"report: {out} ({len(page) / 1024:.0f} KiB, {len(c['wrong_to_right']) + len(c['right_to_wrong'])} "
            "flipped items)")
    return out


# --- in a notebook -----------------------------------------------------------------------------------------------
# What the walkthrough (notebooks/vlrl_walkthrough.ipynb) shows inline, each from what a run has in memory or on disk.
# Every function returns `Html`: Jupyter renders it, and as a str it is the markup, so a test can read it.


class Html(str):
    """HTML markup that Jupyter shows rendered (through `_repr_html_`); as a str it is the markup itself.

    >>> page = Html("<b>7</b>")
    >>> page._repr_html_(), page
    ('<b>7</b>', Html(8 characters of HTML))
    """

    def _repr_html_(self) -> str:
        return str(self)

    def __repr__(self) -> str:  # the plain-text fallback a notebook stores beside the HTML: not the markup again
        return f"Html({len(self)} characters of HTML)"


def _scoped(style: str, scope: str = ".vlrl") -> str:
    """The page's STYLE applied only inside `scope`: a notebook holds other output that it must not restyle."""
    def rule(match) -> str:
        selectors = [s.strip() for s in match.group(1).split(",")]
        return ", ".join(scope if s == "body" else f"{scope} {s}" for s in selectors) + f" {{{match.group(2)}}}"

    return re.sub(r"([^{}]+)\{([^}]*)\}", rule, style)


def _html(body: str) -> Html:
    return Html(f'<div class="vlrl"><style>{_scoped(STYLE)}</style>{body}</div>')


def _image_uri(image, max_side: int = EMBED_MAX_SIDE) -> str:
    """A PIL image (or anything `evaluate.row_images` reads) as a PNG data URI, shrunk to `max_side`."""
    image = image.convert("RGB")
    if max(image.size) > max_side:
        image = image.copy()
        image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _pictures(images, item_id) -> str:
    return "".join(f'<img alt="image of {_e(item_id)}" src="{_image_uri(i)}">' for i in images) or \
        "<p class=warn>no image</p>"


def table_html(values: dict, title: str | None = None) -> Html:
    """A dict (nested ones flattened to dotted keys) as a two-column table.

    >>> page = table_html({"lora_r": 16, "model": {"backend": "transformers"}})
    >>> "<td>lora_r</td><td><code>16</code></td>" in page, "<td>model.backend</td><td><code>transformers</code>" in page
    (True, True)
    """
    return _html((f"<h4>{_e(title)}</h4>" if title else "") + _values_table(values))


def _values_table(values: dict) -> str:
    """Key/value rows as `_flatten` writes them, a string shown without its JSON quotes."""
    rows = []
    for key, text in _flatten(values):
        if len(text) > 1 and text[0] == text[-1] == '"':
            text = json.loads(text)
        rows.append([_e(key), f"<code>{_e(text)}</code>"])
    return _table(None, rows, "small")


def items_html(rows, n: int = 4, *, processor=None) -> Html:
    """The first `n` data items as the model gets them: image(s), the prompt's text, the gold answer and the
    scoring fields; given the processor, the prompt through the chat template and its length in tokens (image
    tokens included), as the length filter measures it.

    Args:
        rows: canonical rows or TRL prompt rows (a list or a `datasets.Dataset`).
        n: how many to show.
        processor: the model's processor (optional).
    """

    cards = []
    for index in range(min(n, len(rows))):
        row = rows[index]
        text = evaluate.question(row) if row.get("prompt") else prompts.question_text(row)
        fields = {k: row.get(k) for k in prompts.SCORING_COLUMNS if row.get(k) not in (None, [], "")}
        fields.update({k: v for k, v in (row.get("metadata") or {}).items() if k in ("task", "skills", "source")})
        details = _table(None, [[_e(k), f"<code>{_e(v)}</code>"] for k, v in fields.items()], "small")
        if processor is not None and row.get("prompt"):
            details += (f"<p><b>Through the chat template</b> ({prompts.prompt_tokens(processor, row)} tokens, image "
                        f"tokens included)</p><pre>{_e(prompts.render_prompt(row, processor))}</pre>")
        cards.append(f'<div class=item><h3>{_e(row["id"])}</h3><div class=row><div class=pic>'
                     f'{_pictures(prompts.row_images(row), row["id"])}</div><div class=qa><p><b>Prompt</b></p>'
                     f"<pre>{_e(text)}</pre>{details}</div></div></div>")
    return _html(f"<p class=meta>{min(n, len(rows))} of {len(rows)} items</p>" + "".join(cards))


def completion_html(completion, row: dict) -> Html:
    """One completion scored against its item, part by part, by the functions training and eval use: the tags
    counted and the degeneration share (format reward), the extracted answer and the rule that matched it
    (correctness reward), and the total R = 0.3 * format + 1.0 * correctness.

    Args:
        completion: the model's text (or a TRL conversational completion).
        row: the item (canonical or TRL prompt row): its gold `answer` and MathVista scoring fields.

    >>> page = completion_html("<REASONING>3+4</REASONING><SOLUTION>7</SOLUTION>", {"id": "a", "answer": "7"})
    >>> "<td><b>total R</b></td><td>0.3 &times; 2 + 1 &times; 2</td><td><b>2.6</b></td>" in page
    True
    """
    from vlrl import answers, rewards

    fmt = rewards.format_parts(completion)
    scored = evaluate.score(completion, row)
    penalty = rewards.DEGENERATE_PENALTY if fmt["degenerate"] else 0.0
    correctness = scored["correctness_reward"]
    correctness_text = "skipped (no gold)" if correctness is None else f"{correctness:g}"
    total = (f"{rewards.FORMAT_WEIGHT:g} &times; {fmt['score']:g} + {rewards.CORRECTNESS_WEIGHT:g} &times; "
             f"{correctness or 0:g}")
    rules = ", ".join(f"{k} {v:g}" for k, v in rewards.MATCH_SCORES.items())
    rows = [
        ["REASONING blocks", str(fmt["reasoning_blocks"]), f"{float(fmt['reasoning_blocks'] == 1):+g}",
         "+1 for exactly one"],
        ["SOLUTION blocks", str(fmt["solution_blocks"]), f"{float(fmt['solution_blocks'] == 1):+g}",
         "+1 for exactly one"],
        ["addCriterion / newline share", f"{fmt['degeneration_ratio']:.0%}", f"{penalty:+g}",
         f"{rewards.DEGENERATE_PENALTY:g} at {rewards.DEGENERATE_SHARE:.0%} or more"],
        ["<b>format reward</b>", "", f"<b>{fmt['score']:g}</b>", f"weight {rewards.FORMAT_WEIGHT:g}"],
        ["prediction (the SOLUTION block)", f"<code>{_e(scored['prediction'])}</code>", "",
         f"gold <code>{_e(row.get('answer'))}</code>"],
        ["matching rule", _e(scored["match"]), "", rules],
        ["<b>correctness reward</b>", "", f"<b>{correctness_text}</b>", f"weight {rewards.CORRECTNESS_WEIGHT:g}"],
        ["<b>total R</b>", total, f"<b>{scored['reward']:g}</b>", "what GSPO compares within a group"],
    ]
    text = answers.as_text(completion)
    verdict = "right" if scored["correct"] else "wrong"
    return _html(f'<div class="side {verdict}"><h4>{_e(row.get("id", ""))}: {verdict}</h4><pre>{_e(text)}</pre>'
                 f"</div>" + _table(["part", "found", "points", "rule"], rows, "small"))


def records_html(records: list[dict], n: int = 8) -> Html:
    """The first `n` eval records as a table: gold, prediction, right or not, format, reward, length, finish.

    >>> "<td>7</td><td>7</td><td>right</td>" in records_html([{"id": "a", "gold": "7", "prediction": "7",
    ...                                                           "correct": True, "format_ok": True, "reward": 2.6}])
    True
    """
    rows = [[_e(r.get("id")), _e(r.get("gold")), _e(r.get("prediction")), "right" if r.get("correct") else "wrong",
             "ok" if r.get("format_ok") else "not ok", _e(r.get("reward")), _e(r.get("completion_tokens")),
             _e(r.get("finish_reason")), f"<code>{_e(str(r.get('completion', ''))[:160])}</code>"]
            for r in records[:n]]
    return _html(f"<p class=meta>{min(n, len(records))} of {len(records)} records</p>"
                 + _table(["id", "gold", "prediction", "correct", "format", "reward", "tokens", "finish",
                           "completion"], rows, "small"))


def comparison_html(comparison: dict) -> Html:
    """The before/after verdict and table: accuracy and format with 95% Wilson intervals, the exact McNemar test,
    the paired 2x2 table, reward means and the breakdown by metadata (what report.html shows)."""
    return _html(f"<p class=verdict>{_verdict(comparison)}</p>" + _comparison_html(comparison))


def flips_html(run_dir: str | Path, limit: int | None = 4) -> Html:
    """The run's flipped items (wrong->right, right->wrong, then format flips), each with its image, question,
    gold answer and both completions, read from the run directory; at most `limit` per group."""
    run_dir = Path(run_dir)
    before = {r["id"]: r for r in evaluate.read_records(run_dir / "eval_before.jsonl")}
    after = {r["id"]: r for r in evaluate.read_records(run_dir / "eval_after.jsonl")}
    comparison = evaluate.compare(list(before.values()), list(after.values()))
    return _html("".join(_flips(comparison, before, after, run_dir / "eval_images", limit)))


def files_html(folder: str | Path, checks: dict | None = None) -> Html:
    """The files in `folder` with their sizes (a sub-folder as its file count and total size), and, when given, the
    checks an export ran on them.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "adapter_config.json").write_text("{}")
    >>> "<td>adapter_config.json</td><td>2 B</td>" in files_html(folder, {"nonzero_lora_B": 14})
    True
    """
    folder = Path(folder)
    if not folder.is_dir():
        return _html(f"<p class=warn>no folder {_e(folder)}</p>")
    rows = []
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            files = [f for f in path.rglob("*") if f.is_file()]
            rows.append([_e(path.name) + "/", f"{len(files)} files, {_size(sum(f.stat().st_size for f in files))}"])
        else:
            rows.append([_e(path.name), _size(path.stat().st_size)])
    out = f"<p class=meta>{_e(folder)}</p>" + _table(["file", "size"], rows, "small")
    if checks:
        out += "<p><b>Verified</b></p>" + _values_table(checks)
    return _html(out)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
