"""Issue 50's figures for every GPU preset, rebuilt from the packed raw rows alone, and the README's table of them.

    python bench/engine_results.py   # writes engine.json's `presets` and `capped_23gib`, capped.md, README.md's table

Reads engine_runs.json's side-by-side keys (SIDE_BY_SIDE: bench/gpu_engine.py's rows of plain TRL and of vlrl,
packed by `python bench/results_io.py pack DIR bench/results/engine_runs.json --key NAME`; a newer key replaces an
older one preset by preset, figure by figure), its Crafter runs (CRAFTER) and capped_runs.json (capped_results.py).
engine.json's `presets` gives each GPU preset (vlrl/presets/ less the tiny ones) these six, each either measured
(value, target, met, measured, gpu, raw and how it was taken) or `{"value": null, "not_run": why}`:
- `ratio_vs_plain_trl`: vlrl's completion tokens/s over plain TRL's (its own defaults) at the preset's length,
  generation batch and micro-batch; the 8B preset also `ratio_vs_plain_trl_at_256` (issue 50 target 1);
- `update_ratio_vs_trl_256` / `_1024`: the training half's (forward, backward, optimizer of the step's 32
  completions) tokens/s over TRL's on the same completions, where the preset's rows are at that length;
- `decode_bound_share_in_step`: the weights' bandwidth bound over the decoding step the GSPO step logs (vlrl's row
  alone; rows before plan s57, which log none: the step's generation over its decoding steps, prefill included);
- `projected_hours`: the whole preset on that GPU from its config and the measured times (projected_mathvista,
  projected_crafter), every completion at its token limit;
- `capped_23gib`: its baseline eval batch and two GSPO steps under a hard 23 GiB cap, with the peak.
Then README.md's lines between its `<!-- engine.json: begin -->` and `<!-- engine.json: end -->` markers are the
table of them (readme_block). Plain python reads the rows; the presets' configs load through vlrl (its venv).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

import tomllib
from capped_results import capped, page

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vlrl.config.runfile import preset, presets

RESULTS = ROOT / "bench" / "results"
# engine_runs.json keys -> the day their rows ran; one day's keys in the order given (the sort below is stable)
SIDE_BY_SIDE = {"fusion": "2026-11-27", "s50": "2026-11-29", "s51": "2026-12-07", "s53": "2026-12-07", "s55": "2026-12-07", "s56": "2026-12-07", "s57": "2026-12-07", "s58": "2026-12-08"}
PRESETS = {  # MathVista preset -> (gpu_engine.py --size, rows' weights): 4-bit bases decode on their int8 repack
    "qwen3-vl-2b-mathvista": ("2b", "bf16"), "qwen3-vl-4b-mathvista": ("4b", "bf16"),
    "qwen3-vl-8b-mathvista": ("8b", "nf4"), "qwen3-vl-8b-mathvista-testmini-seed": ("8b", "nf4"),
    "qwen3-vl-8b-thinking-mathvista": ("8b", "nf4"), "qwen3.5-2b-mathvista": ("qwen3.5-2b", "bf16"),
    "qwen3.5-4b-mathvista": ("qwen3.5-4b", "bf16"), "qwen3.5-9b-mathvista": ("qwen3.5-9b", "nf4"),
}
ALSO_AT = {"qwen3-vl-8b-mathvista": 256}  # issue 50 target 1: the 8B preset also at 256 tokens
CRAFTER = {"qwen3-vl-2b-crafter": "c2b-session", "qwen3-vl-8b-crafter": "c8b-session"}  # -> its run in EPISODES
EPISODES = ("episode_kept_cache", "2026-11-27", "NVIDIA H200")  # engine_runs.json key (plan s46), date, GPU
EVAL_ITEMS = {("AI4Math/MathVista", "testmini"): 1000}  # an [eval] source's items (none: [data] hold_out)
TARGETS = {"ratio": 3.0, "update": 1.5, "decode": 0.45}  # issue 50's targets 1, 2 and 3 (at least)
HOURS = {"qwen3-vl-2b-crafter": 1.0, "qwen3-vl-8b-crafter": 3.0, "qwen3-vl-8b-mathvista": 1.0}  # target 4 (at most)
KEYS = ("ratio_vs_plain_trl", "update_ratio_vs_trl_256", "update_ratio_vs_trl_1024", "decode_bound_share_in_step",
        "projected_hours", "capped_23gib")
NONE = {"value": None}
BEGIN, END = "<!-- engine.json: begin -->", "<!-- engine.json: end -->"


def gpu_presets() -> list[str]:
    """The presets that need a GPU: all but tiny* and *-tiny (which run on CPU)."""
    return [name for name in presets() if not name.startswith("tiny") and not name.endswith("-tiny")]


def side_by_side_rows(runs: dict, key: str, folder: str = "") -> list[dict]:
    """gpu_engine.py's result rows packed at the top of one key (its subfolders are other settings' rows; `folder`:
    those of one of them), a row run with --pass-tokens-per-step as one row per setting (`per_setting`)."""
    return [setting for name, row in sorted(runs[key].items())
            if name.rpartition("/")[0] == folder and name.rpartition("/")[2].startswith("gspo_")
            and name.endswith(".json") for setting in per_setting({**row, "file": name})]


def per_setting(row: dict) -> list[dict]:
    """A row whose measured steps each ran at a `pass_tokens` (gpu_engine.py --pass-tokens-per-step: one process, the
    warm-up steps first) as one row per setting, in the order they ran, its figures the median of that setting's steps
    (gpu_engine.run's rule over a row's steps); any other row as it is."""
    settings = [step.get("pass_tokens") for step in row["steps"]]
    if None in settings:
        return [row]
    warmup = row.get("warmup", len(settings) - len(set(settings)))  # (rows before it was recorded: one step a setting)
    rows, tokens, calls = [], 32 * row["mean_completion_tokens"], 32 // row["generation_batch"]
    for setting in dict.fromkeys(settings[warmup:]):
        steps = [step for step in row["steps"][warmup:] if step["pass_tokens"] == setting]
        step_s, generation_s = (median([step[k] for step in steps]) for k in ("step_s", "generation_s"))
        decode_ms = 1000 * generation_s / (calls * row["mean_completion_tokens"])
        several = f"the median of its {len(steps)} steps at pass_tokens {setting}" if len(steps) > 1 else (
            f"its step at pass_tokens {setting}")
        rows.append({**row, "pass_tokens": setting, "steps": [*row["steps"][:warmup], *steps],
                     "step_s": step_s, "generation_s": generation_s, "training_s": step_s - generation_s,
                     "completion_tokens_per_s": tokens / step_s, "decode_ms_per_step": decode_ms,
                     "decode_bound_share": row["bound_ms"] / decode_ms,
                     "max_reserved_gib": max(step["max_reserved_gib"] for step in steps),
                     "max_allocated_gib": max(step["max_allocated_gib"] for step in steps),
                     "file": f"{row['file']} ({several})", **setting_steps_only(row, warmup, setting)})
    return rows


def median(values: list[float]) -> float:
    """gpu_engine.run's median: the middle value, the upper of two."""
    return sorted(values)[len(values) // 2]


def setting_steps_only(row: dict, warmup: int, setting: int) -> dict:
    """The median of the engine's own device-timed decoding-step ms (a step each in the train log, rows since plan
    s57) over one pass_tokens setting's steps; None for rows without them."""
    logged = row.get("logged_decode_ms_per_step") or []
    if len(logged) != len(row["steps"]):
        return {"decode_steps_only_ms": None, "decode_steps_only_bound_share": None}
    ms = median([m for m, step in zip(logged[warmup:], row["steps"][warmup:]) if step["pass_tokens"] == setting])
    return {"decode_steps_only_ms": ms, "decode_steps_only_bound_share": row["bound_ms"] / ms}


def entry(value: float, target: float | None, measured: str, gpu: str, raw: str, at_most: bool = False, **how) -> dict:
    """A measured figure as engine.json holds it; `met` compares it with issue 50's target (None: no target)."""
    met = None if target is None else (value <= target if at_most else value >= target)
    return {"value": value, "target": target, "met": met, **how, "measured": measured, "gpu": gpu, "raw": raw}


def update_tokens_per_s(row: dict) -> float:
    """Completion tokens per second of the step's training half (forward, backward, optimizer of 32 completions)."""
    return 32 * row["mean_completion_tokens"] / row["training_s"]


def shape_rows(rows: list[dict], name: str, length: int) -> tuple[dict | None, dict | None]:
    """(plain TRL's row, vlrl's row) at a MathVista preset's shape: its size and weights, `length` tokens, and vlrl
    decoding the preset's generation batch at its micro-batch (TRL at its own defaults); None where one is missing."""
    size, weights = PRESETS[name]
    t = preset(name).training
    same = [r for r in rows if (r["size"], r["completion"], r.get("weights", "nf4")) == (size, length, weights)]
    trl = next((r for r in same if r["path"] == "trl"), None)
    ours = [r for r in same if r["path"] != "trl" and r["generation_batch"] == t.generation_batch_size
            and r["micro_batch"] == t.per_device_train_batch_size]
    # the row at the preset's own pass_tokens where the key has one, else its first at the shape
    vlrl = next((r for r in ours if (r.get("pass_tokens") or 0) == t.pass_tokens), ours[0] if ours else None)
    return trl, vlrl


def shape_text(trl: dict, vlrl: dict) -> str:
    """Where a pair ran, in words: vlrl's length, generation batch, micro-batch, path (and passes), and TRL's."""
    passes = f", pass_tokens {vlrl['pass_tokens']}" if vlrl.get("pass_tokens") else ""
    return (f"{vlrl['completion']} tokens, {vlrl['generation_batch']} decoded at once, micro-batch "
            f"{vlrl['micro_batch']} ({vlrl['path']}{passes}); plain TRL: {trl['generation_batch']} at once, "
            f"micro-batch {trl['micro_batch']}")


def decode_figure(vlrl: dict, raw: str, measured: str) -> dict:
    """decode_bound_share_in_step from vlrl's row alone (plain TRL's plays no part): the weights' read bound over
    the decoding step the GSPO step logs (`rollout/decode_ms_per_step`, the engine's device-timed decoding steps:
    rows since plan s57), where the row has it; else, for older rows, over the step's whole generation divided by its
    decoding steps, prefill and picture encoder included. Both are kept where both are measured."""
    steps_ms = vlrl.get("decode_steps_only_ms")
    ms, share = ((steps_ms, vlrl["decode_steps_only_bound_share"]) if steps_ms else
                 (vlrl["decode_ms_per_step"], vlrl["decode_bound_share"]))  # the row's own shares, not derived again
    return entry(
        round(share, 3), TARGETS["decode"], measured, vlrl["gpu"], f"{raw}/{vlrl['file']}",
        decode_ms=round(ms, 2), bound_ms=round(vlrl["bound_ms"], 2),
        figure=("the decoding step the GSPO step logs (rollout/decode_ms_per_step)" if steps_ms else
                "the step's generation over its decoding steps, prefill included (the row logs no decoding step)"),
        whole_generation_ms=round(vlrl["decode_ms_per_step"], 2),
        whole_generation_share=round(vlrl["decode_bound_share"], 3))


def pair_figures(trl: dict, vlrl: dict, raw: str, measured: str) -> dict:
    """ratio_vs_plain_trl and update_ratio_vs_trl_<length> from one row pair."""
    both = f"{raw}/{vlrl['file']}, {raw}/{trl['file']}"
    ratio = vlrl["completion_tokens_per_s"] / trl["completion_tokens_per_s"]
    update = update_tokens_per_s(vlrl) / update_tokens_per_s(trl)
    return {
        "ratio_vs_plain_trl": entry(
            round(ratio, 2), TARGETS["ratio"], measured, vlrl["gpu"], both,
            vlrl_tokens_per_s=round(vlrl["completion_tokens_per_s"], 1),
            plain_trl_tokens_per_s=round(trl["completion_tokens_per_s"], 1),
            at=shape_text(trl, vlrl),
            step_s_each={"vlrl": [round(s["step_s"], 1) for s in vlrl["steps"]],  # the first: compiling (warm-up);
                         "plain_trl": [round(s["step_s"], 1) for s in trl["steps"]]}),  # the last counts
        f"update_ratio_vs_trl_{vlrl['completion']}": entry(
            round(update, 2), TARGETS["update"], measured, vlrl["gpu"], both,
            vlrl_training_s=round(vlrl["training_s"], 2), plain_trl_training_s=round(trl["training_s"], 2)),
    }


def projected_mathvista(name: str, vlrl: dict, raw: str, measured: str) -> dict:
    """A single-turn preset's whole run from its config and vlrl's row at its shape: max_steps x the warm step, the
    evals before and after (their items / eval batch, an eval batch timed as the step's generation per completion
    times the batch: an upper bound, a batch decoding together), compiling (the first step less the warm one) and the
    process's time outside its steps (imports, load, the int8 repack); export not measured."""
    c = preset(name)
    if c.training.max_steps <= 0:
        return {"value": None, "not_run": not_run(name, "projected_hours")}
    steps = c.training.max_steps * vlrl["step_s"]
    per_completion = vlrl["generation_s"] / (c.training.per_device_train_batch_size
                                             * c.training.gradient_accumulation_steps)
    items = EVAL_ITEMS.get((c.eval.source, c.eval.split), c.data.hold_out)
    batches = math.ceil(items / c.eval.batch_size)
    batch_s = c.eval.batch_size * per_completion * c.eval.max_new_tokens / c.training.max_completion_length
    compiling = vlrl["steps"][0]["step_s"] - vlrl["step_s"] if len(vlrl["steps"]) > 1 else 0.0
    outside = vlrl["wall_s"] - sum(s["step_s"] for s in vlrl["steps"])
    total = steps + 2 * batches * batch_s + compiling + outside
    return entry(
        round(total / 3600, 2), HOURS.get(name), measured, vlrl["gpu"], f"{raw}/{vlrl['file']}", at_most=True,
        how=(f"{c.training.max_steps} steps x {vlrl['step_s']:.1f} s ({steps:,.0f} s) + evals 2 x {batches} batches of "
             f"{c.eval.batch_size} ({items:,} items) x {batch_s:.1f} s ({2 * batches * batch_s:,.0f} s; no eval "
             f"measured: a batch as {c.eval.batch_size} x the step's generation per completion, "
             f"{per_completion:.2f} s, an upper bound) + compiling {compiling:.0f} s (the first step less the warm one)"
             f" + {outside:.0f} s outside the steps (imports, load, repack); the data stage and export not "
             f"measured here"))


def rollout_parts(logged: dict) -> str:
    """A step's rollout split by the engine's own marks, where its train log has them (runs since plan s57)."""
    if "rollout/decode_ms_per_step" not in logged:
        return ""
    return (f": prefills {logged['rollout/prefill_time']:.1f} s, a decoding step "
            f"{logged['rollout/decode_ms_per_step']:.1f} ms")


def projected_crafter(name: str, run: dict, raw: str, measured: str, gpu: str) -> dict:
    """An episode preset's whole run from its config and a `vlrl run` of two steps at its generation batch: max_steps
    x the warm step scaled to the preset's episodes per step, the evals before and after (eval seeds / eval batch,
    each batch as long as the warm step's rollout of one generation batch; greedy evals decode the same lengths),
    compiling (the first step less the warm one) and the run's own model load and adapter export stages."""
    c = preset(name)
    ran = tomllib.loads(run["config.toml"])["training"]
    log = [r for r in run["train_log.jsonl"] if "step_time" in r]
    first, warm = log[0], log[-1]
    ran_episodes = ran["per_device_train_batch_size"] * ran["gradient_accumulation_steps"]
    episodes = c.training.per_device_train_batch_size * c.training.gradient_accumulation_steps
    step_s = warm["step_time"] * episodes / ran_episodes
    batch_s = warm["rollout_time"] / (ran_episodes / ran["generation_batch_size"])
    batches = math.ceil(c.env.eval_seeds / c.eval.batch_size)
    compiling = first["step_time"] - warm["step_time"]
    stages = {s["stage"][:3]: s["seconds"] for s in next(v for k, v in run.items() if k.endswith("stages.json"))["stages"]}
    load_export = stages["1/5"] + stages["5/5"]
    total = c.training.max_steps * step_s + 2 * batches * batch_s + compiling + load_export
    return entry(
        round(total / 3600, 2), HOURS.get(name), measured, gpu, raw, at_most=True,
        how=(f"{c.training.max_steps} steps x {step_s:.1f} s ({episodes} episodes a step in batches of "
             f"{c.training.generation_batch_size}; the warm step of {ran_episodes} took {warm['step_time']:.1f} s, "
             f"rollout {warm['rollout_time']:.1f} s{rollout_parts(warm)}, update "
             f"{warm['step_time'] - warm['rollout_time']:.1f} s) + evals "
             f"2 x {batches} batches of {c.eval.batch_size} episodes x {batch_s:.1f} s ({2 * batches * batch_s:,.0f} s)"
             f" + compiling {compiling:.0f} s + load and export {load_export:.0f} s (its stages)"))


def measured_figures(runs: dict) -> dict[str, dict]:
    """{preset: {figure: entry}} from every SIDE_BY_SIDE key, oldest first, so a newer key's figure replaces an older
    one's preset by preset, and the Crafter presets' projected hours from EPISODES."""
    found: dict[str, dict] = {}
    for key, measured in sorted(SIDE_BY_SIDE.items(), key=lambda kv: kv[1]):
        rows, raw = side_by_side_rows(runs, key), f"engine_runs.json#{key}"
        eager = side_by_side_rows(runs, key, "eager")
        for name in PRESETS:
            length = preset(name).training.max_completion_length
            for at in [length] + ([ALSO_AT[name]] if name in ALSO_AT else []):
                trl, vlrl = shape_rows(rows, name, at)
                figures = pair_figures(trl, vlrl, raw, measured) if trl and vlrl else {}
                # decoding runs the same with the training layers eager (vlrl.training.compiled_layers): a key's
                # eager/ row tells it where the key has no row on the preset's path
                decoded = vlrl or shape_rows(eager, name, at)[1]
                if decoded:
                    figures["decode_bound_share_in_step"] = decode_figure(decoded, raw, measured)
                suffix = "" if at == length else f"_at_{at}"
                found.setdefault(name, {}).update({
                    k if k.startswith("update") else k + suffix: v for k, v in figures.items()
                    if not k.startswith("update") or at in (256, 1024)})
                if vlrl and at == length:
                    found.setdefault(name, {})["projected_hours"] = projected_mathvista(name, vlrl, raw, measured)
    key, measured, gpu = EPISODES
    for name, run in CRAFTER.items():
        packed = {k.split("/", 1)[1]: v for k, v in runs[key].items() if k.startswith(run + "/")}
        found.setdefault(name, {})["projected_hours"] = projected_crafter(
            name, packed, f"engine_runs.json#{key}/{run}/", measured, gpu)
    return found


def capped_entry(row: dict, cap: dict) -> dict:
    """A preset's capped_23gib in `presets`: the verdict and its peaks (capped_results.py's row)."""
    if row["value"] is None:
        return {"value": None, "not_run": row["note"]}
    return {"value": row["value"], "met": row["value"], "cap_gib": row["cap_gib"],
            "peak_reserved_gib": row["max_reserved_gib"], "peak_allocated_gib": row["max_allocated_gib"],
            "process_peak_gib": row["process_peak_gib"], "process_peak_whole": row["process_peak_whole"],
            "measured": cap["measured"], "gpu": cap["gpu"], "raw": row["raw"]}


def not_run(name: str, key: str) -> str:
    """Why a preset has no measured `key`, in one line."""
    if name not in PRESETS:
        return {"ratio_vs_plain_trl": "an episode preset: plain TRL has no episode loop to run beside it (issue 50's "
                                      "target 1 is the MathVista presets')",
                "decode_bound_share_in_step": f"an episode preset: its runs (engine_runs.json {EPISODES[0]}) log no "
                                              f"decoding step time against the bound",
                "projected_hours": f"no warm step of it in engine_runs.json {EPISODES[0]} (the Qwen3-VL Crafter "
                                   f"presets' runs)",
                }.get(key, "an episode preset: no plain TRL update on its episodes to compare with (issue 50's "
                           "target 2 is the 8B MathVista preset's)")
    c = preset(name)
    size, weights = PRESETS[name]
    length = int(key.rsplit("_", 1)[1]) if key.startswith("update") else c.training.max_completion_length
    if key.startswith("update") and length != c.training.max_completion_length and ALSO_AT.get(name) != length:
        return (f"issue 50's update target is the 8B preset's, at 256 and 1,024 tokens; this preset runs "
                f"{c.training.max_completion_length:,} tokens")
    if key == "projected_hours" and c.training.max_steps <= 0:
        return "max_steps is not set: its steps follow its data's size (an epoch)"
    alone = ("projected_hours", "decode_bound_share_in_step")  # from vlrl's row alone
    rows = "vlrl row" if key in alone else "rows side by side (plain TRL and vlrl)"
    return (f"no {rows} at its shape in engine_runs.json {', '.join(SIDE_BY_SIDE)}: {size} {weights}, "
            f"{length:,} tokens, {c.training.generation_batch_size} decoded at once, micro-batch "
            f"{c.training.per_device_train_batch_size}")


def preset_table(found: dict[str, dict], cap: dict) -> dict[str, dict]:
    """engine.json's `presets`: every GPU preset with all six KEYS (measured or not_run), then any others it has."""
    table = {}
    for name in gpu_presets():
        figures = {**found.get(name, {})}
        if name in cap["presets"]:
            figures["capped_23gib"] = capped_entry(cap["presets"][name], cap)
        table[name] = {key: figures.pop(key, None) or {"value": None, "not_run": not_run(name, key)} for key in KEYS}
        table[name].update(figures)
    return table


def cell(figure: dict, fmt: str) -> str:
    """A table cell: the value in `fmt`, bold where it meets issue 50's target, "-" where not run."""
    if figure["value"] is None:
        return "-"
    text = fmt.format(figure["value"])
    return f"**{text}**" if figure.get("met") else text


def readme_block(engine: dict) -> str:
    """README.md's table of engine.json's `presets`, its markers included."""
    header = ("| preset | x plain TRL's tokens/s at its shape (target 3x) | update vs TRL's, 256 / 1,024 tokens (1.5x) | "
              "decoding in the step, of the bound (45%) | projected hours | under 23 GiB (peak reserved GiB) |")
    lines = [BEGIN, "", header, "|---|---|---|---|---|---|"]
    for name, p in engine["presets"].items():
        hours = cell(p["projected_hours"], "{:.2f}")
        if p["projected_hours"].get("target"):
            hours += f" (target {p['projected_hours']['target']:.1f})"
        capped_23 = p["capped_23gib"]
        under = "-" if capped_23["value"] is None else (
            f"{'**yes**' if capped_23['value'] else 'no'} ({capped_23['peak_reserved_gib']})")
        lines.append(f"| `{name}` | {cell(p['ratio_vs_plain_trl'], '{:.2f}x')} | "
                     f"{cell(p['update_ratio_vs_trl_256'], '{:.2f}x')} / {cell(p['update_ratio_vs_trl_1024'], '{:.2f}x')}"
                     f" | {cell(p['decode_bound_share_in_step'], '{:.1%}')} | {hours} | {under} |")
    at_256 = {k: v for p in engine["presets"].values() for k, v in p.items() if k.endswith("_at_256")}
    sources = sorted({(f["measured"], f["raw"].split("#")[0] if f["raw"].startswith("capped") else
                       f"engine_runs.json {f['raw'].split('#')[1].split('/')[0]}", f["gpu"])
                      for p in engine["presets"].values() for f in p.values() if f["value"] is not None})
    note = ("Bold: meets issue 50's target; -: not run (each entry's `not_run` in `bench/results/engine.json` "
            "`presets` says why). The 8B preset at 256 tokens, its 16 at once: "
            f"{cell(at_256.get('ratio_vs_plain_trl_at_256', NONE), '{:.2f}x')} plain TRL's tokens/s, decoding at "
            f"{cell(at_256.get('decode_bound_share_in_step_at_256', NONE), '{:.1%}')} of the bound. Random weights of the real "
            "configs, every completion at its token limit; measured " +
            ", ".join(f"{day} (`{source}`, {gpu})" for day, source, gpu in sources) +
            "; this table is written by `python bench/engine_results.py`.")
    code_kept = "`".join(part.replace(" ", "\0") if i % 2 else part for i, part in enumerate(note.split("`")))
    lines += ["", *(line.replace("\0", " ") for line in textwrap.wrap(code_kept, 118, break_on_hyphens=False)), "", END]
    return "\n".join(lines)


def with_block(readme: str, block: str) -> str:
    """README.md's text with the lines between its markers replaced by `block`."""
    head, rest = readme.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    runs = json.loads((RESULTS / "engine_runs.json").read_text())
    cap = capped(json.loads((RESULTS / "capped_runs.json").read_text()))
    engine = json.loads((RESULTS / "engine.json").read_text())
    engine["capped_23gib"] = cap
    engine["presets"] = preset_table(measured_figures(runs), cap)
    (RESULTS / "engine.json").write_text(json.dumps(engine, indent=2, ensure_ascii=False) + "\n")
    (RESULTS / "capped.md").write_text(page(cap))
    readme = ROOT / "README.md"
    readme.write_text(with_block(readme.read_text(), readme_block(engine)))
    print(readme_block(engine))


if __name__ == "__main__":
    main()
