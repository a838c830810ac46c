"""Issue 50's per-preset figures, from plan s50's side-by-side steps (bench/engine_jobs.sh): each MathVista preset's
completion tokens/s against plain TRL's at its own batch and length, the update's (the step less its generation)
against TRL's on the same 32 completions, and the decoding's share of the bandwidth bound inside the step.

    python bench/engine_results.py DIR     # DIR: gpu_engine.py's gspo_*.json of one plan s50 (both paths a shape)
    python bench/results_io.py pack DIR bench/results/engine_runs.json --key s50   # its raw rows, kept

Writes engine.json's `ratio_vs_plain_trl`, `update_ratio_vs_trl_256` / `_1024` and `decode_bound_share_in_step`
(each row's file named under `raw`). A shape with only one of its two paths measured is left out and said.
"""

from __future__ import annotations

import json
import sys
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


def main(directory: str) -> None:
    rows = [{**json.loads(p.read_text()), "file": p.name} for p in sorted(Path(directory).glob("gspo_*.json"))]
    found = figures(rows)
    alone = {(r["size"], r["completion"], r["path"]) for r in rows} - {
        (r["size"], r["completion"], r["path"]) for pair in pairs(rows).values() for r in pair}
    if alone:
        print(f"left out, one path only: {sorted(alone)}")
    engine = json.loads((RESULTS / "engine.json").read_text())
    engine.update(found)
    (RESULTS / "engine.json").write_text(json.dumps(engine, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
