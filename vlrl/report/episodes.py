"""The report's blocks for an episode run: the verdict (success and return, their paired tests), the statistics
table, and every flipped episode as a filmstrip of its saved frames with each turn's reply.

    episode_verdict(comparison), episode_table(comparison), episode_flips(comparison, before, after, run)

`vlrl.report.page.render` and the notebook views (`comparison_html`, `flips_html`) use these when the comparison's
`kind` is "episodes".
"""

from __future__ import annotations

from pathlib import Path

from vlrl.config.rundir import RunDir
from vlrl.envs.film import filmstrip
from vlrl.report.blocks import _ids, change_rows, esc, image_uri, num, pct, table

STRIP_MAX_SIDE = 2048  # a filmstrip is wide: embedded up to this width


def episode_verdict(c: dict) -> str:
    """One sentence: success and mean return before and after, the flips, and both paired tests."""
    real = min(c["mcnemar_p"], c["return_permutation_p"]) < 0.05
    return (f"Success {pct(c['success_before'])} &rarr; {pct(c['success_after'])} on {c['n_paired']} paired "
            f"episodes: {len(c['failure_to_success'])} failure&rarr;success, {len(c['success_to_failure'])} "
            f"success&rarr;failure, McNemar exact p = {num(c['mcnemar_p'])}; mean return "
            f"{num(c['return_mean_before'])} &rarr; {num(c['return_mean_after'])}, paired permutation p = "
            f"{num(c['return_permutation_p'])}: "
            + ("<b>a real change</b> at the 0.05 level." if real else
               "<b>not distinguishable from noise</b> at the 0.05 level."))


def episode_table(c: dict) -> str:
    """Success (Wilson 95%) and mean return (bootstrap 95%) with their paired tests, the paired 2x2 table of success
    and the counted abnormal ends of each side."""
    def cell(key, side, fmt):
        value, ci = c[f"{key}_{side}"], c.get(f"{key}_{side}_ci95")
        interval = f" <span class=ci>[{fmt(ci[0])}, {fmt(ci[1])}]</span>" if ci else ""
        return f"{fmt(value)}{interval}" if value is not None else "n/a"

    def signed(value, fmt):
        return "n/a" if value is None else ("+" if value >= 0 else "") + fmt(value)

    rows = [["success", cell("success", "before", pct), cell("success", "after", pct),
             signed(c["success_delta"], pct), f"McNemar exact {num(c['mcnemar_p'])}"],
            ["mean return", cell("return_mean", "before", num), cell("return_mean", "after", num),
             signed(c["return_delta"], num), f"paired permutation {num(c['return_permutation_p'])}"]]
    for key, label in (("length_mean", "turns per episode (mean)"), ("invalid_actions", "invalid actions"),
                       ("truncated", "truncated (context full)"), ("failed", "failed (environment raised)"),
                       ("dropped_images", "images dropped (caps)")):
        rows.append([label, num(c.get(f"{key}_before")), num(c.get(f"{key}_after")), "", ""])
    t = c["table"]
    out = [table(["", "before", "after", "change", "paired test p"], rows, "stats"),
           "<p>Paired 2&times;2 table of success (the McNemar test uses only the discordant cells):</p>",
           table(["", "success after", "failure after"],
                 [["<b>success before</b>", str(t["both_success"]), str(t["success_to_failure"])],
                  ["<b>failure before</b>", str(t["failure_to_success"]), str(t["both_failure"])]], "small")]
    if c["only_before"] or c["only_after"]:
        out.append(f'<p class=warn>Unpaired episodes, left out of the statistics: {len(c["only_before"])} only '
                   f'before{_ids(c["only_before"])}, {len(c["only_after"])} only after{_ids(c["only_after"])}.</p>')
    if c.get("crafter"):
        out.append(crafter_table(c["crafter"]))
    return "\n".join(out)


def crafter_table(crafter: dict) -> str:
    """Crafter as its paper reports it: the Crafter score and each of the 22 achievements' success rate, before and
    after, with 95% intervals (bootstrap for the score, Wilson for the rates), the score's paired change and each
    achievement's gained/lost episodes with the exact McNemar p."""
    b, a = crafter["before"], crafter["after"]
    if b["score"] is None:
        return ""

    def percent(value, ci):
        return f"{value:.1f}% <span class=ci>[{ci[0]:.1f}, {ci[1]:.1f}]</span>"

    delta = crafter.get("score_delta")
    def score(value, ci, sign=""):
        return f"{value:{sign}.2f}% <span class=ci>[{ci[0]:{sign}.2f}, {ci[1]:{sign}.2f}]</span>"

    rows = [["<b>Crafter score</b>", score(b["score"], b["score_ci95"]), score(a["score"], a["score_ci95"]),
             "" if delta is None else score(delta, crafter["score_delta_ci95"], "+"), "paired bootstrap"]]
    for name, rate in b["rates"].items():
        moved = crafter.get("achievements", {}).get(name)
        rows.append([esc(name), percent(rate, b["rates_ci95"][name]),
                     percent(a["rates"][name], a["rates_ci95"][name]),
                     "" if moved is None else f"+{moved['gained']} / -{moved['lost']}",
                     "" if moved is None or not (moved["gained"] or moved["lost"]) else
                     f"McNemar exact {num(moved['mcnemar_p'])}"])
    return ("<p>Crafter, scored as its paper scores it: each achievement's success rate (the share of episodes "
            "that unlocked it) and the Crafter score, exp(mean(ln(1 + rate))) - 1 over the 22 achievements, in "
            f"percent; {b['episodes']} episodes a side.</p>"
            + table(["", "before", "after", "change (episodes gained / lost)", "paired test"], rows, "stats"))


def achievements_at_k_table(c: dict) -> str:
    """achievements@k of a comparison with sampled episodes: for every k the expected distinct achievements of k
    episodes per world before and after, with intervals over worlds and the paired interval of the change, the test
    on achievements per episode, and per achievement the share of worlds that any of the K episodes reached."""
    ak = c.get("achievements_at_k")
    if not ak:
        return ""
    rows = change_rows("achievements", ak["k"],
                       *((ak[f"achievements_at_k_{part}"], ak[f"achievements_at_k_{part}_ci95"])
                         for part in ("before", "after", "delta")), ".2f")
    reached = [[esc(name), pct(ak["reached_before"][name]), pct(ak["reached_after"][name])] for name in ak["reached_after"]]
    return "\n".join([
        (f"<p>achievements@k: the expected number of distinct Crafter achievements that at least one of k episodes of a "
         f"world unlocks ({ak['samples']} sampled episodes of each of {ak['n_paired']} worlds; achievements@1 is the "
         f"mean per episode). {esc(ak['test'])}: p = {num(ak['achievements_at_1_p'])}.</p>"),
        table(["", "before (95% CI over worlds)", "after", "change (95% paired bootstrap CI)"], rows, "stats"),
        f"<p>Worlds where any of the {ak['samples']} episodes reached each achievement:</p>",
        table(["achievement", "before", "after"], reached, "small")])


def episode_strip(record: dict | None, frame_dir: Path, label: str) -> str:
    """One episode of one side: its filmstrip (each frame labelled with the turn and its action) and its replies."""
    if record is None:
        return f"<div class=side><h4>{label}</h4><p class=warn>no record</p></div>"
    from PIL import Image

    paths = [frame_dir / name for name in record.get("frames", [])]
    present = [p for p in paths if p.exists()]
    names = ["reset"] + [",".join(t.get("actions") or []) or "invalid" for t in record["turns"]]
    labels = [f"t{k} {names[k] if k < len(names) else ''}" for k in range(len(present))]
    if present:
        strip = filmstrip([Image.open(p) for p in present], labels, height=96)
        picture = f'<img alt="filmstrip of {esc(record["id"])}" src="{image_uri(strip, STRIP_MAX_SIDE)}">'
    else:
        picture = "<p class=warn>frames not saved in episode_frames/</p>"
    outcome = "success" if record["success"] else "failure"
    replies = "\n".join(f"t{k + 1}: {t.get('reply', '')}" for k, t in enumerate(record["turns"]))
    return (f'<div class="side {"right" if record["success"] else "wrong"}"><h4>{label}: {outcome}, return '
            f'{num(record["return"])}, {len(record["turns"])} turns, {esc(record.get("status"))}</h4>{picture}'
            f'<pre>{esc(replies)}</pre></div>')


def episode_flips(c: dict, before: dict, after: dict, run: RunDir, limit: int | None = None) -> list[str]:
    """Every flipped episode (failure -> success, then success -> failure) as filmstrips, before above after."""
    out = []
    for title, ids in (("Failure &rarr; success", c["failure_to_success"]),
                       ("Success &rarr; failure", c["success_to_failure"])):
        out.append(f"<h3>{title} ({len(ids)})</h3>")
        out += [f'<div class=item><h3>{esc(i)}</h3>{episode_strip(before.get(i), run.episode_frames("before"), "before")}'
                f'{episode_strip(after.get(i), run.episode_frames("after"), "after")}</div>' for i in ids[:limit]] \
            or ["<p>none</p>"]
        if limit is not None and len(ids) > limit:
            out.append(f"<p class=meta>... and {len(ids) - limit} more in report.html</p>")
    return out
