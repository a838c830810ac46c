"""report.html: one self-contained page of a run, read from the run directory alone, with its plots.

    vlrl report --run-dir runs/demo     # -> runs/demo/report.html and runs/demo/plots/{comparison,training}.png

The page holds the verdict, the before/after comparison with its statistics, the training curves, every flipped
item (correctness, then format) with its image, question, gold answer and both completions, the data report and
the resolved config; an episode run's shows success and return with their paired tests and every flipped episode
as a filmstrip (`vlrl.report.episodes`). Images are embedded as data URIs and a Content-Security-Policy forbids every other source, so
the file opens offline, from anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlrl.config.rundir import RunDir
from vlrl.evaluation.records import read_records
from vlrl.report.blocks import (
    STYLE,
    comparison_table,
    esc,
    file_uri,
    flatten,
    flips,
    pass_at_k_table,
    read_evals,
    table,
    verdict,
)
from vlrl.report.episodes import achievements_at_k_table, episode_flips, episode_table, episode_verdict
from vlrl.report.plots import plot_comparison, plot_pass_at_k, plot_training

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"  # no script, no network: the page is the data


def render(run_dir: str | Path | RunDir, *, log=None) -> Path:
    """Writes `plots/*.png` and `report.html` into the run directory; returns the report's path.

    Reads config.toml, data_report.json, train_log.jsonl, eval_before.jsonl, eval_after.jsonl, eval_images/ and
    samples_before/after.jsonl when the run sampled (the pass@k section);
    the comparison is computed from the records (and saved as comparison.json when that is missing). Any missing
    file but the two evals becomes a note in the page.

    Args:
        run_dir: the run directory.
        log: optional callable for a one-line note (the page's path, size and flipped items).

    Raises:
        RunDirError: no run directory there, or it lacks eval_before.jsonl or eval_after.jsonl.
        EvalError: a damaged record file, or records a comparison cannot pair.
    """
    run = RunDir(run_dir)
    before, after, c = read_evals(run)
    if not run.comparison.exists():
        run.comparison.write_text(json.dumps(c, indent=2))
    is_episodes = c.get("kind") == "episodes"
    comparison_png = plot_comparison(c, run.plots / "comparison.png")
    train_log = read_records(run.train_log)
    training_png = plot_training(train_log, run.plots / "training.png")
    collapsed = [r["collapse/since_step"] for r in train_log if r.get("collapse/since_step") is not None]
    pass_at_k = []
    if c.get("pass_at_k"):
        pass_at_k_png = plot_pass_at_k(c["pass_at_k"], run.plots / "pass_at_k.png")
        measure = c["pass_at_k"].get("measure")  # "success": a draw is an episode, pass@k is success@k
        pass_at_k = [f"<h2>{'success@k and achievements@k' if measure else 'pass@k'}: sharpening or learning</h2>",
                     f'<img class=plot alt="pass@k before and after" src="{file_uri(pass_at_k_png)}">',
                     pass_at_k_table(c), achievements_at_k_table(c)]

    config_text = run.config_file.read_text() if run.config_file.exists() else None
    data_report = json.loads(run.data_report.read_text()) if run.data_report.exists() else None
    name = run.path.name
    if config_text:
        first = next((line for line in config_text.splitlines() if line.startswith("name =")), None)
        name = first.split("=", 1)[1].strip().strip('"') if first else name
    sections = [
        f"<h1>vlrl run: {esc(name)}</h1><p class=meta>{esc(run.path.resolve())}</p>",
        *[f"<p class=warn><b>{esc(line)}</b></p>" for line in [(data_report or {}).get("trains_on_test_split")] if line],
        *[f"<p class=warn><b>The policy collapsed from training step {step}: its groups went flat and its samples "
          "repeated each other, so nothing was left to learn (vlrl.training.collapse; train_log.jsonl's collapse/* "
          "numbers).</b></p>" for step in collapsed[:1]],
        f"<p class=verdict>{episode_verdict(c) if is_episodes else verdict(c)}</p>",
        "<h2>Comparison</h2>", f'<img class=plot alt="before/after" src="{file_uri(comparison_png)}">',
        episode_table(c) if is_episodes else comparison_table(c),
        *pass_at_k,
        "<h2>Training curves</h2>",
        (f'<img class=plot alt="training curves" src="{file_uri(training_png)}">' if training_png
         else "<p class=warn>no train_log.jsonl metrics in this run directory</p>"),
        *(["<h2>Flipped episodes</h2>", *episode_flips(c, before, after, run)] if is_episodes else
          ["<h2>Flipped items</h2>", *flips(c, before, after, run.eval_images)]),
        "<h2>Data</h2>",
        (table(None, [[esc(k), f"<code>{esc(v)}</code>"] for k, v in flatten(data_report)], "small")
         if data_report else "<p class=warn>no data_report.json</p>"),
        "<h2>Resolved config</h2>",
        f"<pre>{esc(config_text)}</pre>" if config_text else "<p class=warn>no config.toml</p>",
    ]
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>vlrl report: {esc(name)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(sections) + "\n</body></html>\n")
    run.report.write_text(page, encoding="utf-8")
    if log is not None:
        flipped = (c["failure_to_success"] + c["success_to_failure"] if is_episodes
                   else c["wrong_to_right"] + c["right_to_wrong"])
        log(f"report: {run.report} ({len(page) / 1024:.0f} KiB, {len(flipped)} flipped "
            f"{'episodes' if is_episodes else 'items'})")
    return run.report
