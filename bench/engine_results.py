"""Issue 50's per-preset figures, from plan s50's side-by-side steps (bench/engine_jobs.sh): each MathVista preset's
completion tokens/s against plain TRL's at its own batch and length, the update's (the step less its generation)
against TRL's on the same 32 completions, and the decoding's share of the bandwidth bound inside the step.

    python bench/engine_results.py DIR --measured 2026-11-29   # DIR: gpu_engine.py's gspo_*.json (both paths a shape)
    python bench/results_io.py pack DIR bench/results/engine_runs.json --key s50   # its raw rows, kept
    python bench/engine_results.py --runs fusion --measured 2026-11-27   # rows already packed in engine_runs.json

Writes engine.json's `ratio_vs_plain_trl`, `update_ratio_vs_trl_256` / `_1024` and `decode_bound_share_in_step`
(each row's file named under `raw`, each entry with the date it was measured). Entries join what engine.json holds,
preset by preset, so a plan that ran some shapes replaces those and keeps the others. A shape with only one of its two
paths measured is left out and said.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PRESETS = {  # (size, completion tokens, weights) -> the preset whose shape plan s50 runs
    ("8b", 1024, "nf4"): "qwen3-vl-8b-mathvista", ("8b", 256, "nf4"): "qwen3-vl-8b-mathvista at 256 tokens",
    ("2b", 1024, "bf16"): "qwen3-vl-2b-mathvista", ("4b", 1024, "bf16"): "qwen3-vl-4b-mathvista",
    ("8b", 1536, "nf4"): "qwen3-vl-8b-thinking-mathvista",
}
TARGETS = {"ratio": 3.0, "update": 1.5, "decode": 0.45}  # issue 50's targets 1, 2 and 3


def pairs(rows: list[dict]) -> dict[str, tuple[dict, dict]]:
    """{preset: (plain TRL's row, vlrl's row)} for each shape that has both."""
    by_shape: dict[tuple, dict] = {}
    for row in rows:
        shape = (row["size"], row["completion"], row.get("weights", "nf4"))
        by_shape.setdefault(shape, {})["trl" if row["path"] == "trl" else "vlrl"] = row
    return {PRESETS.get(shape, "x".join(map(str, shape))): (paths["trl"], paths["vlrl"])
            for shape, paths in by_shape.items() if {"trl", "vlrl"} <= set(paths)}


def update_tokens_per_s(row: dict) -> float:
    """Completion tokens per second of the step's training half (forward, backward, optimizer of 32 completions)."""
    return 32 * row["mean_completion_tokens"] / row["training_s"]


def figures(rows: list[dict], raw: str = "engine_runs.json#s50") -> dict:
    """engine.json's keys from the rows of one plan s50 (gpu_engine.py's result objects)."""
    out = {"ratio_vs_plain_trl": {}, "decode_bound_share_in_step": {}}
    for preset, (trl, vlrl) in sorted(pairs(rows).items()):
        ratio = vlrl["completion_tokens_per_s"] / trl["completion_tokens_per_s"]
        out["ratio_vs_plain_trl"][preset] = {
            "value": round(ratio, 2), "target": TARGETS["ratio"], "met": ratio >= TARGETS["ratio"],
            "vlrl_tokens_per_s": round(vlrl["completion_tokens_per_s"], 1),
            "plain_trl_tokens_per_s": round(trl["completion_tokens_per_s"], 1),
            "at": (f"{vlrl['completion']} tokens, {vlrl['generation_batch']} decoded at once, micro-batch "
                   f"{vlrl['micro_batch']} ({vlrl['path']}); plain TRL: {trl['generation_batch']} at once, "
                   f"micro-batch {trl['micro_batch']}"),
            "step_s_each": {"vlrl": [round(s["step_s"], 1) for s in vlrl["steps"]],  # the first: compiling
                            "plain_trl": [round(s["step_s"], 1) for s in trl["steps"]]},  # (warm-up); the last counts
            "raw": f"{raw}/{vlrl['file']}, {raw}/{trl['file']}"}
        share = vlrl["decode_bound_share"]
        out["decode_bound_share_in_step"][preset] = {
            "value": round(share, 3), "target": TARGETS["decode"], "met": share >= TARGETS["decode"],
            "decode_ms": round(vlrl["decode_ms_per_step"], 2), "bound_ms": round(vlrl["bound_ms"], 2),
            "raw": f"{raw}/{vlrl['file']}"}
        if preset.startswith("qwen3-vl-8b-mathvista"):
            update = update_tokens_per_s(vlrl) / update_tokens_per_s(trl)
            out[f"update_ratio_vs_trl_{vlrl['completion']}"] = {
                "value": round(update, 2), "target": TARGETS["update"], "met": update >= TARGETS["update"],
                "vlrl_training_s": round(vlrl["training_s"], 2), "plain_trl_training_s": round(trl["training_s"], 2),
                "raw": f"{raw}/{vlrl['file']}, {raw}/{trl['file']}"}
    return out


def merged(engine: dict, found: dict, measured: str) -> dict:
    """engine.json with `found`'s entries (each stamped `measured`) in place of the same presets' earlier ones."""
    for key, entries in found.items():
        if key.startswith("update_ratio"):
            engine[key] = {**entries, "measured": measured}
        else:
            engine[key] = {**engine.get(key, {}), **{p: {**e, "measured": measured} for p, e in entries.items()}}
    return engine


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("directory", nargs="?", help="gpu_engine.py's gspo_*.json of one plan (raw: engine_runs.json#s50)")
    p.add_argument("--runs", help="instead, the rows packed under this key of engine_runs.json (its top level)")
    p.add_argument("--measured", required=True, help="the date the rows were measured, e.g. 2026-11-29")
    args = p.parse_args()
    if args.runs:
        packed = json.loads((RESULTS / "engine_runs.json").read_text())[args.runs]
        rows = [{**row, "file": name} for name, row in sorted(packed.items()) if name.startswith("gspo_")]
        raw = f"engine_runs.json#{args.runs}"
    else:
        rows = [{**json.loads(f.read_text()), "file": f.name} for f in sorted(Path(args.directory).glob("gspo_*.json"))]
        raw = "engine_runs.json#s50"
    found = figures(rows, raw=raw)
    alone = {(r["size"], r["completion"], r["path"]) for r in rows} - {
        (r["size"], r["completion"], r["path"]) for pair in pairs(rows).values() for r in pair}
    if alone:
        print(f"left out, one path only: {sorted(alone)}")
    engine = merged(json.loads((RESULTS / "engine.json").read_text()), found, args.measured)
    (RESULTS / "engine.json").write_text(json.dumps(engine, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
