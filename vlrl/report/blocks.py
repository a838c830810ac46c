"""The HTML blocks that report.html and the notebook views are both built from: escaping and number formats,
tables, PNG data URIs, the page's style, and the run's sections (the verdict, the comparison table, the flipped
items with their images and both completions).

Every block is a string of markup with every value escaped: a completion is shown as text, never as markup.

    >>> table(None, [[esc("<b>7</b>"), pct(0.25)]])
    '<table class=""><tbody><tr><td>&lt;b&gt;7&lt;/b&gt;</td><td>25.0%</td></tr></tbody></table>'
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from vlrl.config.rundir import RunDir
from vlrl.evaluation.compare import compare, one_answer_notes, with_samples
from vlrl.evaluation.records import image_paths, read_records

EMBED_MAX_SIDE = 512  # flipped items' images are shrunk to this side in the page (the files keep their size)

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


# --- text and tables ---------------------------------------------------------------------------------------------

def esc(value) -> str:
    """Any value as escaped text; None as nothing."""
    return html.escape("" if value is None else str(value))


def pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def num(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def flatten(data, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts -> (dotted key, JSON text) rows; long values are cut at 300 characters.

    >>> flatten({"model": {"backend": "transformers"}, "lora_r": 16})
    [('model.backend', '"transformers"'), ('lora_r', '16')]
    """
    if isinstance(data, dict) and data:
        return [row for k, v in data.items() for row in flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    text = json.dumps(data)
    return [(prefix, text if len(text) < 300 else text[:300] + " ...")]


def table(header: list[str] | None, rows: list[list[str]], cls: str = "") -> str:
    """A table of cells that are markup already (escape values with `esc` first)."""
    head = "<thead><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}">{head}<tbody>{body}</tbody></table>'


def _ids(ids: list) -> str:
    return f" ({esc(', '.join(map(str, ids)))})" if ids else ""


# --- images ------------------------------------------------------------------------------------------------------

def image_uri(image, max_side: int = EMBED_MAX_SIDE) -> str:
    """A PIL image as a PNG data URI, shrunk to `max_side`."""
    image = image.convert("RGB")  # a copy, so the shrinking below leaves the caller's image alone
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def file_uri(path: Path, max_side: int | None = None) -> str:
    """A PNG file as a data URI, as it is on disk unless it is larger than `max_side`."""
    data = Path(path).read_bytes()
    if max_side:
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        if max(image.size) > max_side:
            return image_uri(image, max_side)
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


# --- the run's sections ------------------------------------------------------------------------------------------

def read_evals(run: RunDir) -> tuple[dict, dict, dict]:
    """A run's eval records before and after, by id, and their comparison computed from them (the source of truth;
    comparison.json is their summary). RunDirError when either eval file is missing."""
    run.require(run.eval_before, run.eval_after, what="the before/after report (`vlrl run` writes both evals)")
    before = {r["id"]: r for r in read_records(run.eval_before)}
    after = {r["id"]: r for r in read_records(run.eval_after)}
    comparison = compare(list(before.values()), list(after.values()))
    return before, after, with_samples(comparison, run.samples_before, run.samples_after)


def verdict(c: dict) -> str:
    """One sentence: the accuracy change, its flips and whether the exact McNemar test calls it real."""
    significant = c["mcnemar_p"] < 0.05
    return (f"Accuracy {pct(c['accuracy_before'])} &rarr; {pct(c['accuracy_after'])} on {c['n_paired']} paired "
            f"items: {len(c['wrong_to_right'])} wrong&rarr;right, {len(c['right_to_wrong'])} right&rarr;wrong, "
            f"McNemar exact p = {num(c['mcnemar_p'])}: "
            + ("<b>a real change</b> at the 0.05 level." if significant else
               "<b>not distinguishable from noise</b> at the 0.05 level.")
            + "".join(f" <b>Warning</b>, {html.escape(note)}." for note in one_answer_notes(c)))


def comparison_table(c: dict) -> str:
    """The statistics of a `vlrl.evaluation.compare.compare` result: rates with Wilson intervals and McNemar p, reward means,
    the paired 2x2 table, the format flips, unpaired items and the breakdown by metadata."""
    rows = []
    for metric, label, p in (("accuracy", "accuracy", c["mcnemar_p"]), ("format", "format compliance",
                                                                            c["format_mcnemar_p"])):
        cells = [label]
        for side in ("before", "after"):
            low, high = c[f"{metric}_{side}_ci95"]
            cells.append(f"{pct(c[f'{metric}_{side}'])} <span class=ci>[{low:.1%}, {high:.1%}]</span>")
        delta = c.get(f"{metric}_delta")
        cells += ["n/a" if delta is None else f"{delta:+.1%}", num(p)]
        rows.append(cells)
    for key, label in (("reward", "reward (mean)"), ("format_reward", "format reward (mean)"),
                       ("correctness_reward", "correctness reward (mean)"),
                       ("completion_tokens", "completion tokens (mean)"), ("degenerate_rate", "degenerate share"),
                       ("truncated_rate", "hit max_new_tokens")):
        name = key if key.endswith("_rate") else f"{key}_mean"
        before, after = c.get(f"{name}_before"), c.get(f"{name}_after")
        fmt = pct if key.endswith("_rate") else num
        rows.append([label, fmt(before), fmt(after), "", ""])
    out = [table(["", "before", "after", "change", "McNemar exact p"], rows, "stats")]
    t = c["table"]
    out.append("<p>Paired 2&times;2 table of correctness (the McNemar test uses only the discordant cells):</p>")
    out.append(table(["", "right after", "wrong after"],
                     [["<b>right before</b>", str(t["both_right"]), str(t["right_to_wrong"])],
                      ["<b>wrong before</b>", str(t["wrong_to_right"]), str(t["both_wrong"])]], "small"))
    out.append(f"<p>Format flips: {len(c['format_gained'])} gained{_ids(c['format_gained'])}, "
               f"{len(c['format_lost'])} lost{_ids(c['format_lost'])}.</p>")
    if c["only_before"] or c["only_after"]:
        out.append(f'<p class=warn>Unpaired items, left out of the statistics: {len(c["only_before"])} only before'
                   f'{_ids(c["only_before"])}, {len(c["only_after"])} only after{_ids(c["only_after"])}.</p>')
    for key, groups in (c.get("breakdown") or {}).items():
        rows = [[esc(value), str(g["n"]), pct(g["accuracy_before"]), pct(g["accuracy_after"]),
                 str(g["wrong_to_right"]), str(g["right_to_wrong"]), num(g["mcnemar_p"])]
                for value, g in groups.items()]
        out.append(f"<h3>By {esc(key)}</h3>")
        out.append(table([esc(key), "items", "accuracy before", "accuracy after", "wrong&rarr;right",
                          "right&rarr;wrong", "McNemar p"], rows, "small"))
    return "\n".join(out)


def with_ci(value, ci, fmt: str = ".1%") -> str:
    """A value and its 95% interval, in `fmt`."""
    return f"{value:{fmt}} <span class=ci>[{ci[0]:{fmt}}, {ci[1]:{fmt}}]</span>"


def change_rows(name: str, ks, before, after, change, fmt: str) -> list[list[str]]:
    """One row per k of an @k table: "name@k", before and after (each (values, intervals)) and the paired change
    (values, intervals), in `fmt`."""
    return [[f"{name}@{k}", with_ci(b, b_ci, fmt), with_ci(a, a_ci, fmt), with_ci(d, d_ci, "+" + fmt)]
            for k, b, b_ci, a, a_ci, d, d_ci in zip(ks, *before, *after, *change)]


def pass_at_k_table(c: dict) -> str:
    """The pass@k block of a comparison with sampled evals: what the curves mean in one sentence, pass@k before and
    after for every k with the paired interval of the change, the test on pass@1, and the items' moves."""
    pk = c.get("pass_at_k")
    if not pk:
        return ""
    b_side, a_side = pk["before"], pk["after"]
    name, unit = ("success", "worlds") if pk.get("measure") == "success" else ("pass", "items")  # episodes: worlds
    rows = change_rows(name, pk["k"], (b_side["pass_at_k"], b_side["ci95"]), (a_side["pass_at_k"], a_side["ci95"]),
                       (pk["pass_at_k_delta"], pk["pass_at_k_delta_ci95"]), ".1%")
    rows += [["solved by no draw", with_ci(b_side["never"], b_side["never_ci95"]),
              with_ci(a_side["never"], a_side["never_ci95"]), f"{a_side['never'] - b_side['never']:+.1%}"],
             ["solved by every draw", with_ci(b_side["always"], b_side["always_ci95"]),
              with_ci(a_side["always"], a_side["always_ci95"]), f"{a_side['always'] - b_side['always']:+.1%}"]]
    m = pk["moves"]
    return "\n".join([
        f"<p class=verdict>{esc(pk['meaning'])}</p>",
        table(["", f"before (95% CI over {unit})", "after", "change (95% paired bootstrap CI)"], rows, "stats"),
        (f"<p>{name}@1 change: {pk['pass_at_1_delta']:+.1%}, {esc(pk['test'])} p = "
         f"{num(pk['pass_at_1_p'])}, on {pk['n_paired']} {unit} with {pk['samples']} draws each.</p>"),
        table(["before \\ after", "never solved", "sometimes", "always"],
              [[f"<b>{s}</b>", *(str(m[f"{s}_to_{t}"]) for t in ("never", "sometimes", "always"))]
               for s in ("never", "sometimes", "always")], "small"),
        (f"<p>Learned (never &rarr; solved): {len(pk['learned'])}{_ids(pk['learned'])}; sharpened (sometimes "
        f"&rarr; always): {len(pk['sharpened'])}{_ids(pk['sharpened'])}; lost (solved &rarr; never): "
        f"{len(pk['lost'])}{_ids(pk['lost'])}.</p>"),
    ])


def _completion(label: str, record: dict | None) -> str:
    if record is None:
        return f"<div class=side><h4>{label}</h4><p class=warn>no record</p></div>"
    right = "right" if record.get("correct") else "wrong"
    prediction = "(no single SOLUTION block)" if record.get("prediction") is None else record["prediction"]
    return (f'<div class="side {right}"><h4>{label}: {right}, prediction <code>{esc(prediction)}'
            f'</code></h4><pre>{esc(record.get("completion"))}</pre>'
            f'<p class=meta>reward {esc(record.get("reward"))}, format {"ok" if record.get("format_ok") else "not ok"}, '
            f'{esc(record.get("completion_tokens"))} tokens, finish {esc(record.get("finish_reason"))}</p></div>')


def _flip(item_id, before: dict | None, after: dict | None, image_dir: Path) -> str:
    images = image_paths(image_dir, item_id)
    pictures = "".join(f'<img alt="image of {esc(item_id)}" src="{file_uri(p, EMBED_MAX_SIDE)}">' for p in images)
    if not images:
        pictures = "<p class=warn>image not saved in eval_images/</p>"
    record = before or after
    return (f'<div class=item><h3>{esc(item_id)}</h3><div class=row><div class=pic>{pictures}</div>'
            f'<div class=qa><p><b>Question</b></p><pre>{esc(record.get("question"))}</pre>'
            f'<p><b>Gold</b> <code>{esc(record.get("gold"))}</code></p></div></div>'
            f'<div class=row>{_completion("before", before)}{_completion("after", after)}</div></div>')


def flips(c: dict, before: dict, after: dict, image_dir: Path, limit: int | None = None) -> list[str]:
    """Every flipped item (correctness, then format), each group under its heading; `limit` items per group."""
    out = []
    shown = set(c["wrong_to_right"] + c["right_to_wrong"])  # a format flip that is also a correctness flip: once
    for title, ids in (("Wrong &rarr; right", c["wrong_to_right"]), ("Right &rarr; wrong", c["right_to_wrong"]),
                       ("Format gained (correctness unchanged)", [i for i in c["format_gained"] if i not in shown]),
                       ("Format lost (correctness unchanged)", [i for i in c["format_lost"] if i not in shown])):
        out.append(f"<h3>{title} ({len(ids)})</h3>")
        out += [_flip(i, before.get(i), after.get(i), image_dir) for i in ids[:limit]] or ["<p>none</p>"]
        if limit is not None and len(ids) > limit:
            out.append(f"<p class=meta>... and {len(ids) - limit} more in report.html</p>")
    return out
