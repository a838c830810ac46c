"""What the walkthrough (notebooks/vlrl_walkthrough.ipynb) shows inline, each view from what a run has in memory or
on disk: `items_html` (data items with their images and prompts), `completion_html` (one completion's reward, part by
part), `records_html`, `comparison_html`, `flips_html` (the report's sections), `files_html` (an export and its
checks) and `table_html`.

Every view returns `Html`: Jupyter renders it, and as a str it is the markup, so a test can read it. The page's
style comes along, scoped to the view, so it never restyles the rest of the notebook.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vlrl.config.rundir import RunDir
from vlrl.evaluation.evaluate import question, score
from vlrl.evaluation.records import read_records
from vlrl.grammar import answers, rewards
from vlrl.model import lengths, prompts
from vlrl.report.blocks import (
    STYLE,
    comparison_table,
    esc,
    file_uri,
    flatten,
    flips,
    image_uri,
    pass_at_k_table,
    read_evals,
    table,
    verdict,
)
from vlrl.report.episodes import episode_flips, episode_strip, episode_table, episode_verdict


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


def _pictures(images, item_id) -> str:
    return "".join(f'<img alt="image of {esc(item_id)}" src="{image_uri(i)}">' for i in images) or \
        "<p class=warn>no image</p>"


def table_html(values: dict, title: str | None = None) -> Html:
    """A dict (nested ones flattened to dotted keys) as a two-column table.

    >>> page = table_html({"lora_r": 16, "model": {"backend": "transformers"}})
    >>> "<td>lora_r</td><td><code>16</code></td>" in page, "<td>model.backend</td><td><code>transformers</code>" in page
    (True, True)
    """
    return _html((f"<h4>{esc(title)}</h4>" if title else "") + _values_table(values))


def _values_table(values: dict) -> str:
    """Key/value rows as `flatten` writes them, a string shown without its JSON quotes."""
    rows = []
    for key, text in flatten(values):
        if len(text) > 1 and text[0] == text[-1] == '"':
            text = json.loads(text)
        rows.append([esc(key), f"<code>{esc(text)}</code>"])
    return table(None, rows, "small")


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
        text = question(row) if row.get("prompt") else prompts.question_text(row)
        fields = {k: row.get(k) for k in prompts.SCORING_COLUMNS if row.get(k) not in (None, [], "")}
        fields.update({k: v for k, v in (row.get("metadata") or {}).items() if k in ("task", "skills", "source")})
        details = table(None, [[esc(k), f"<code>{esc(v)}</code>"] for k, v in fields.items()], "small")
        if processor is not None and row.get("prompt"):
            details += (f"<p><b>Through the chat template</b> ({lengths.prompt_tokens(processor, row)} tokens, image "
                        f"tokens included)</p><pre>{esc(prompts.render_prompt(row, processor))}</pre>")
        pictures = _pictures(prompts.row_images(row, decode=True), row["id"])
        cards.append(f'<div class=item><h3>{esc(row["id"])}</h3><div class=row><div class=pic>{pictures}</div>'
                     f"<div class=qa><p><b>Prompt</b></p><pre>{esc(text)}</pre>{details}</div></div></div>")
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
    fmt = rewards.format_parts(completion)
    scored = score(completion, row)
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
        ["prediction (the SOLUTION block)", f"<code>{esc(scored['prediction'])}</code>", "",
         f"gold <code>{esc(row.get('answer'))}</code>"],
        ["matching rule", esc(scored["match"]), "", rules],
        ["<b>correctness reward</b>", "", f"<b>{correctness_text}</b>", f"weight {rewards.CORRECTNESS_WEIGHT:g}"],
        ["<b>total R</b>", total, f"<b>{scored['reward']:g}</b>", "what GSPO compares within a group"],
    ]
    text = answers.as_text(completion)
    right = "right" if scored["correct"] else "wrong"
    return _html(f'<div class="side {right}"><h4>{esc(row.get("id", ""))}: {right}</h4><pre>{esc(text)}</pre>'
                 f"</div>" + table(["part", "found", "points", "rule"], rows, "small"))


def records_html(records: list[dict], n: int = 8) -> Html:
    """The first `n` eval records as a table: gold, prediction, right or not, format, reward, length, finish.

    >>> "<td>7</td><td>7</td><td>right</td>" in records_html([{"id": "a", "gold": "7", "prediction": "7",
    ...                                                           "correct": True, "format_ok": True, "reward": 2.6}])
    True
    """
    rows = [[esc(r.get("id")), esc(r.get("gold")), esc(r.get("prediction")), "right" if r.get("correct") else "wrong",
             "ok" if r.get("format_ok") else "not ok", esc(r.get("reward")), esc(r.get("completion_tokens")),
             esc(r.get("finish_reason")), f"<code>{esc(str(r.get('completion', ''))[:160])}</code>"]
            for r in records[:n]]
    return _html(f"<p class=meta>{min(n, len(records))} of {len(records)} records</p>"
                 + table(["id", "gold", "prediction", "correct", "format", "reward", "tokens", "finish",
                          "completion"], rows, "small"))


def comparison_html(comparison: dict) -> Html:
    """The before/after verdict and table: accuracy and format with 95% Wilson intervals, the exact McNemar test,
    the paired 2x2 table, reward means and the breakdown by metadata (what report.html shows)."""
    if comparison.get("kind") == "episodes":
        return _html(f"<p class=verdict>{episode_verdict(comparison)}</p>" + episode_table(comparison))
    return _html(f"<p class=verdict>{verdict(comparison)}</p>" + comparison_table(comparison))


def pass_at_k_html(comparison: dict, plot: str | Path | None = None) -> Html:
    """The pass@k section of a comparison with sampled evals (its meaning, the table, the moves), with the curve
    when `plot` (a PNG, e.g. RUN_DIR/plots/pass_at_k.png) is given."""
    image = f'<img class=plot alt="pass@k" src="{file_uri(Path(plot))}">' if plot and Path(plot).exists() else ""
    return _html(image + (pass_at_k_table(comparison) or "<p class=warn>no sampled evals ([eval] samples = 0)</p>"))


def flips_html(run_dir: str | Path | RunDir, limit: int | None = 4) -> Html:
    """The run's flipped items (wrong->right, right->wrong, then format flips), each with its image, question,
    gold answer and both completions, read from the run directory; at most `limit` per group."""
    run = RunDir(run_dir)
    before, after, comparison = read_evals(run)
    if comparison.get("kind") == "episodes":  # flipped episodes as filmstrips
        return _html("".join(episode_flips(comparison, before, after, run, limit)))
    return _html("".join(flips(comparison, before, after, run.eval_images, limit)))


def episodes_html(run_dir: str | Path | RunDir, when: str = "before", n: int = 2) -> Html:
    """The first `n` episodes of eval_<when>.jsonl as filmstrips with their replies, from the run directory."""
    run = RunDir(run_dir)
    records = read_records(run.eval_file(f"eval_{when}"))
    return _html("".join(f"<div class=item><h3>{esc(r['id'])}</h3>"
                         f"{episode_strip(r, run.episode_frames(when), when)}</div>" for r in records[:n]))


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
        return _html(f"<p class=warn>no folder {esc(folder)}</p>")
    rows = []
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            files = [f for f in path.rglob("*") if f.is_file()]
            rows.append([esc(path.name) + "/", f"{len(files)} files, {_size(sum(f.stat().st_size for f in files))}"])
        else:
            rows.append([esc(path.name), _size(path.stat().st_size)])
    out = f"<p class=meta>{esc(folder)}</p>" + table(["file", "size"], rows, "small")
    if checks:
        out += "<p><b>Verified</b></p>" + _values_table(checks)
    return _html(out)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
