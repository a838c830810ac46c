"""The learning table of bench/results/inputs.md (issue 48): a run on inputs beyond one picture, before and after GSPO,
with the paired test and the one-picture baseline, its before/after records committed beside the table.

    python -m vlrl run --config bench/learning/two-images.toml --run-dir runs/learn-two-images
    python -m vlrl eval --run-dir runs/learn-two-images --images first                  # the base, one chart seen
    python -m vlrl eval --run-dir runs/learn-two-images --adapter runs/learn-two-images/adapter --images first
    python bench/inputs_learning.py two-images runs/learn-two-images

writes bench/results/inputs/<task>/{eval_before,eval_after,eval_base_first,eval_adapter_first}.jsonl (those present)
and bench/results/inputs.json (`learning`: one entry per task, replaced on a rerun; `gpu` kept as it is) and .md.
"""

import json
import shutil
import sys
from pathlib import Path

from vlrl.evaluation.compare import compare, one_answer_notes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "inputs.json"
RECORDS = ("eval_before", "eval_after", "eval_base_first", "eval_adapter_first")


READING = """How to read it. Each row is `bench/learning/two-images.toml` (two_chart_compare: two one-bar charts, "which
shows the larger value, 1 or 2"; 60 GSPO steps of 2 prompts x 8 samples at lr 1e-3 on CPU) with the tiny model's
warm start at 150 (`--set model.warm_start_steps=150 --set model.warm_start_items=512`), 300 (`--set
model.warm_start_steps=300`) or 600 supervised steps (the run file's). The pipeline holds end to end: two pictures per prompt decoded, trained on, recorded and shown.
What does not hold is the issue's learning claim: GSPO gained nothing significant on any row. Below 600 warm steps
the model answers "2" to every item (with or without its second picture), so every group's samples agree and GSPO has
no signal; at 600 it reads both charts (98%, against 76% with the second blanked: the first chart's height alone
says something), and nothing is left to gain. A row with p < 0.01 needs a warm start between the two, or a harder
variant (difficulty 2: three bars a chart), and more steps than this CPU session had."""


def learning_entry(task: str, run_dir: Path) -> dict:
    """The task's row: accuracy before and after, the exact paired test, the one-picture baseline, the records."""
    folder = RESULTS.parent / "inputs" / task
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in RECORDS:
        if (run_dir / f"{name}.jsonl").exists():
            shutil.copy(run_dir / f"{name}.jsonl", folder / f"{name}.jsonl")
            paths[name] = str((folder / f"{name}.jsonl").relative_to(ROOT))
    c = compare(run_dir / "eval_before.jsonl", run_dir / "eval_after.jsonl")
    entry = {"task": task, "before": c["accuracy_before"], "after": c["accuracy_after"], "p_value": c["mcnemar_p"],
             "n": c["n_paired"], "wrong_to_right": len(c["wrong_to_right"]), "right_to_wrong": len(c["right_to_wrong"]),
             "before_records": paths["eval_before"], "after_records": paths["eval_after"],
             "notes": one_answer_notes(c), "config": _config(run_dir)}
    if "eval_base_first" in paths and "eval_adapter_first" in paths:
        one = compare(run_dir / "eval_base_first.jsonl", run_dir / "eval_adapter_first.jsonl")
        both_vs_one = compare(run_dir / "eval_base_first.jsonl", run_dir / "eval_before.jsonl")
        entry["one_picture"] = {"before": one["accuracy_before"], "after": one["accuracy_after"],
                                "p_value": one["mcnemar_p"], "before_records": paths["eval_base_first"],
                                "after_records": paths["eval_adapter_first"],
                                "both_vs_one_p": both_vs_one["mcnemar_p"]}
    return entry


def _config(run_dir: Path) -> dict:
    import tomllib

    return tomllib.loads((run_dir / "config.toml").read_text())


def markdown(results: dict) -> str:
    lines = ["# Inputs beyond one picture (issue 48)", "",
             "## Learning: the tiny Qwen3-VL on CPU, before and after GSPO, on held-out items", "",
             ("| task | items | before | after | exact McNemar p | wrong->right / right->wrong | one picture seen: "
             "before -> after |"), "|---|---|---|---|---|---|---|"]
    for e in results.get("learning", []):
        one = e.get("one_picture")
        seen = (f"{one['before']:.1%} -> {one['after']:.1%} (p = {one['p_value']:.3g}); both against one before: "
                f"p = {one['both_vs_one_p']:.3g}" if one else "-")
        lines.append(f"| {e['task']} | {e['n']} | {e['before']:.1%} | {e['after']:.1%} | {e['p_value']:.3g} | "
                     f"{e['wrong_to_right']} / {e['right_to_wrong']} | {seen} |")
    for e in results.get("learning", []):
        verdict = "a significant gain" if e["p_value"] < 0.01 else "no significant gain (p >= 0.01)"
        lines += ["", f"**{e['task']}**: {verdict}. " + " ".join(f"{note}." for note in e.get("notes", []))]
    lines += ["", READING]
    lines += ["", ("Records: bench/results/inputs/<task>/ (eval_before, eval_after; eval_base_first and "
              "eval_adapter_first: the same items with each item's second picture blanked, `vlrl eval --images "
              "first`). Commands: bench/inputs_learning.py's docstring."), ""]
    return "\n".join(lines)


def main(task: str, run_dir: str) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"learning": [], "gpu": []}
    results["learning"] = [e for e in results.get("learning", []) if e["task"] != task]
    results["learning"].append(learning_entry(task, Path(run_dir)))
    results.setdefault("gpu", [])
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    RESULTS.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
