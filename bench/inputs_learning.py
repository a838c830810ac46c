"""The learning table of bench/results/inputs.md (issue 48): a run on inputs beyond one picture, before and after GSPO,
with the paired test and the one-picture baseline, its before/after records committed beside the table.

    python -m vlrl run --config bench/learning/two-images.toml --run-dir runs/learn-two-images
    R=runs/learn-two-images; S="--samples 8 --temperature 1 --seed 0 --images first"   # one chart seen, the same draws
    python -m vlrl eval --run-dir $R $S --output $R/samples_base_first.jsonl
    python -m vlrl eval --run-dir $R --adapter $R/adapter $S --output $R/samples_adapter_first.jsonl
    python bench/inputs_learning.py two-images $R [RUN_DIR...]   # RUN_DIRs: the same run file at other training seeds
    # bench/learning/video.toml the same way, with --images still (one frame held) and _still in the output names:
    #   python bench/inputs_learning.py video $R [RUN_DIR...]
    python bench/inputs_learning.py archive two-images two-images-compare COMMIT   # an entry kept, its records in git
    python bench/inputs_learning.py gpu ALONE_DIR EXPANDABLE_DIR   # the GPU table: bench/gpu_engine.py --inputs results
    python bench/inputs_learning.py gpu-capped bench/results/capped_runs.json 4641   # each row under a hard cap

A run with `[eval] samples` (the two-images run file) is compared on its sampled evals, the policy GSPO trains: each
item's first draw (the paired McNemar test) and pass@1 over the draws (the paired permutation test); its greedy evals'
figures go into the entry as `greedy`, their records are not copied. Writes bench/results/inputs/<task>/ (the records
compared: samples_* or eval_*, with the one-picture pair when present), bench/results/inputs.json (`learning`: one
entry per task, replaced on a rerun; `gpu` kept as it is) and .md.
"""

import json
import shutil
import sys
from pathlib import Path

from vlrl.evaluation.compare import compare, one_answer_notes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "inputs.json"
SIDES = ("before", "after", "base_first", "adapter_first", "base_still", "adapter_still")
ONE = {"first": "the first picture alone", "still": "one frame of the clip"}  # `vlrl eval --images MODE`


READING = """How to read it. `two-images` is `bench/learning/two-images.toml` as shipped, a curriculum: two_chart_close
at difficulty 2 (two one-bar charts whose values are exactly 2 of 9 apart, "which shows the larger value, 1 or 2"; one
chart alone is right at most 9/14 = 64.3% of the time, `synthetic.close_ceiling(2)`), from a 600-step warm start on
two_chart_compare at difficulty 1 (bars 3 to 8 apart: `[model] warm_start_tasks`, `warm_start_difficulty`), then 200
GSPO steps of 2 prompts x 8 samples at temperature 1, a LoRA on the output layer trained by SGD at 2.0; 600 held-out
items (none showing a warm-start picture), measured on its sampled evals: 8 seeded draws per item at temperature 1,
the same draws' seeds before and after. Its one-picture column is the same sampled eval with each item's second chart
blanked (`vlrl eval --images first --samples 8`): the trained policy's first draw is right on 84.8% of the items with
both charts and 52.8% with one (pass@1 84.2% against 53.8%; 215 / 23 items, McNemar p = 3.0e-40), under the ceiling
of 64.3%. Training seed 1 alike: 83.5% with both, 57.0% with one (pass@1 83.0% against 57.8%; 208 / 49, p =
1.7e-24); the base_first records are the same for both seeds (one warm start, the same items and draws). Part of
the gain is the format: 9.3% of the warm start's first draws were malformed, 2.3% after. Tried before, at 120 GSPO
steps: 100 held-out items, 74% -> 84% (12 / 2, p = 0.013); 200 items, seeds 0 and 1, 80.5% -> 84.0% and 85.5% (14 /
7, p = 0.19; 16 / 6, p = 0.053), pass@1 73.2% -> 82.1% and 82.8% (p < 1e-13): the first draw of 200 items was too
few for a gain of 4-5 points, so the run file holds out 600 and trains 200 steps.
A warm start on two_chart_close itself did not learn to read the pairs (below); two_chart_compare's did.
`two-images-compare` is the earlier run file (two_chart_compare alone, a 450-step warm start, 120 steps, 100 held-out
items): a significant gain that did not need the second picture (below). The `two-images-warmN` rows are the run file
before it (60 steps of AdamW at 1e-3 on a LoRA over the layers), measured greedy, at warm starts of 150
(`--set model.warm_start_steps=150 --set model.warm_start_items=512`), 300 and 600 steps: below 600 the model answers
"2" to every item greedy, at 600 it reads both charts (98%) and nothing is left.

`video` is `bench/learning/video.toml` as shipped (block_motion: 8 frames of 128 px at 4 fps, a black square a third of
the frame's side moving left or right by half the width, wrapping round the edge from a uniform start, so where it is
in any one frame is uniform under both answers; the reasoning names only the way, "The square moves right, so 2."; a
200-step warm start, then the two-images recipe), measured on its sampled evals as two-images is. The one-frame
column is the same sampled eval with each clip's 4th frame held for all 8 (`vlrl eval --images still --samples 8`).
The gain needs the motion: the trained policy scores 88% on the first draw with the clip and 49% with one frame of it
(pass@1 84.9% against 46.2%; 39 / 0 items, McNemar p = 3.6e-12), a coin flip, as one frame must be; training seed
2's policy alike, 87% against 52% (pass@1 83.0% against 45.5%; 35 / 0, p = 5.8e-11). The warm start's
length decides it, as for the charts: at 600 steps the clip is read outright (greedy 100%, pass@1 98.1%) and every
GSPO group was flat (all 8 draws right) from the first step, nothing to learn; at 200 greedy reads it (89%) but the
draws barely do (pass@1 42.4%; share of "1" 42% on gold-1 clips, 36% on gold-2; 18% of draws malformed), and GSPO
sharpens the draws onto the reading. An earlier form of the task (no wrap: the square's start on the side it leaves,
so the first frame alone told the way) was read as fully at 600 steps.

Warm starts on the two-picture tasks themselves: the tiny model compared two pictures in a clip before it did across
two images. Tried, each with the two-images recipe, none read by its own warm start
(greedy, every held-out item gets one answer; sampled, the answers do not depend on the gold one): `two_chart_close`
(two one-bar charts, the values exactly a gap apart, so one chart alone is right at most
`synthetic.close_ceiling` of the time: 9/14 with a gap of 2, 3/4 with 3) at 600 warm steps with a gap of 2 (greedy
43%, "2" for 98% of gold-1 items; sampled share of "1" 46% on gold-1, 51% on gold-2; final warm-start loss 0.113) and
of 3 (greedy 54%, "1" everywhere; share of "1" 44% / 45%; loss 0.081), where two_chart_compare (bars 3 to 8 apart)
was read at 98%; and `square_shift` (block_motion's square in two 128 px pictures, the second moved a quarter of the
width, one picture alone exactly a coin flip) at 300 (greedy 50%, "2" for 67% of both golds; share of "1" 43% / 46%;
loss 0.086) and 600 steps (greedy 51%, "2" everywhere; loss 0.083). Qwen3-VL's patch embedding takes two frames at
once (temporal patch size 2: a picture is two copies of itself), so a clip's motion between frames shows inside one
patch, where two pictures meet only in the language model's attention: the likely reason, not measured.
Two pictures are read through a curriculum instead (the `two-images` row): two_chart_compare's 600-step warm start
reads the close pairs already (greedy 87.3% on the 600 held-out items; first draw 69.0%, pass@1 71.8%; 51.3% with one
chart), and GSPO sharpens the draws onto that reading.

What the two-images-compare row does not show: that the gain needs both pictures. With the second chart blanked the
trained policy scores 64.0% on the first draw (pass@1 68.9%), against 67.0% (70.0%) with both (6 / 3 items, p =
0.51), and the one-chart gain is nearly as large as the two-chart one (48.0% -> 64.0%, pass@1 52.8% -> 68.9%). The
task leaks its answer through one chart: at difficulty 1 the two bars are at least 3 of 9 apart, so a first bar of
1-3 is always the smaller and one of 7-9 always the larger, and the first chart
alone can reach 88.9% (the best guess from its value). The warm600 row says the same (76% with one chart). So this
run file shows GSPO learning on two-picture inputs, end to end, but not issue 48's "cannot be solved from one
image": that needs a task whose one chart says nothing, such as "are the two bars the same height?" with the same
height in half the items, or values drawn so that neither chart's bar predicts the answer.

Tried since, not yet learned: two tasks whose one chart says nothing (`vlrl.base.synthetic.SAME_TASKS`: exactly half
the items "same", each chart's value or colour uniform under both answers, so one chart alone is exactly a coin
flip), the same run file with `--set "data.tasks=['two_chart_same']"` ("the same value?", warm starts of 450 and 600
steps) or `['two_chart_same_color']` ("the same colour?", 300, 500 and 800 steps). None leaves GSPO a signal:
greedy, every held-out item gets the same answer (49-51%); sampled, the share of "1" does not depend on the gold
answer (on gold-1 / gold-2 items: 50.5% / 51.0% and 44.9% / 45.8% for the values, 53.0% / 47.5%, 53.0% / 48.0%
and 54.5% / 50.7% for the colours): a group's spread in reward is sampling noise, nothing GSPO can follow. The
800-step colours run, trained anyway (120 GSPO steps as shipped): first draw 54% -> 56% (11 / 9, McNemar p = 0.82),
pass@1 51.1% -> 50.2% (p = 0.79), greedy 50% -> 50% ("1" everywhere); the share of "1" rose to 77% / 75%.
The values are read a little at 600 (the heights the reasoning states correlate 0.57 with the true ones) but the
answer does not follow them (47% of draws answer as their own stated values say); the colours are not read at all
(the right colour named in 17% of draws, chance 1 in 6), and the 800-step warm start's loss stays near 0.12 from step
280 to its end (0.115), where two_chart_compare's fell to 0.068 by 600. The next things to try: a longer warm start
(two_chart_compare was read at 600 steps, not at 450), or larger pictures than 4 tokens each.

A clip an item, tried and not yet learned: `shape_motion` (a shape moving left or right over 8 frames at 4 fps, 64 px
frames), the two-images recipe (head LoRA, SGD 2.0, gspo-paper, temperature 1, 8 sampled draws), warm starts of 150,
300, 450 and 600 steps (`--set model.warm_start_steps=N`). Greedy, every held-out item gets "1" (55%, the share of
gold-1 items); sampled, the share of "2" on gold-1 / gold-2 items is 0.30 / 0.28 at 300 and 0.48 / 0.41 at 600: the
clip is not read. At the first digit of the reasoning's "starts at x = ", the 600-step model's logits move by at most
3e-4 from item to item (the random model: 0.017; two_chart_compare's 450-step warm start, which reads its charts,
1.04; its 300-step one, which does not, 0.006); a 900-step warm start: 4e-4, its lower loss (0.121 against 0.162) the
text's number prior. GSPO on the 600-step start (120 steps): first draw 41% -> 52% (28 / 17, McNemar p = 0.135),
pass@1 42.9% -> 52.0% (p = 0.051), pass@8 100% -> 68%, greedy 55% -> 55%, a collapse onto "1" (96% of draws); with
one frame of each clip (`vlrl eval --images still`) the figures are the same, 41% -> 52%: none of it needs the motion.
The next things to try: a reasoning target that states only the direction, or larger frames.

Why the gain is in the sampled policy and not the greedy answer, measured on the 450-step warm start (the figures
below come from the runs' eval records and train_log.jsonl; their records are not committed). Its answer is a
thresholded, weak function of the two pictures: greedy, every gold-1 item is answered "1" and only 28 of the 51
gold-2 items "2", whatever the gap between the bars (3 to 8 of 9); the reasoning's two stated values agree with its
answer in 53 of 100 completions (the model does not read the heights it writes). Sampled at temperature 1, pass@1 is
51.6% against 77% greedy, and the share of "2" is 36% on gold-1 items and 50% on gold-2 ones: most of a group's
reward spread is sampling noise. At 300 warm steps the sampled answers do not depend on the pictures at all (share of
"2": 44% on gold-1 items, 43% on gold-2): nothing to learn from. Read at the answer token (logit of "2" minus logit
of "1", the greedy completion teacher-forced up to `<SOLUTION>`), the 450-step model ranks the held-out items with an
AUC of 0.882: 77 of 100 right at its own threshold, 86 at the best threshold chosen after the fact. Every GSPO
setting tried left that AUC where it was (0.882, 0.884 after the head runs): GSPO moves the threshold and sharpens the
draws toward the answer the pictures already favour; it does not improve the reading. The greedy answer, the mode,
can then gain at most 9 items here, too few for p < 0.01; the sampled policy gains far more:

| 450-step warm start, then (held-out, greedy) | steps | greedy before -> after | gained / lost | p |
|---|---|---|---|---|
| LoRA on the layers, AdamW 1e-3, temperature 1 (the earlier run file) | 60 | 77.0% -> 76.0% | 0 / 1 | 1 |
| the same at temperature 0.5 | 120 | 77.0% -> 76.0% | 0 / 1 | 1 |
| the same at 3e-3, temperature 1: format reward 1.9 -> 0.9 by step 20, sampled accuracy ~45% | 49, stopped | - | - | - |
| the same at 3e-3, temperature 0.5: format reward 2.0 -> 0 by step 50, every group flat | 54, stopped | - | - | - |
| LoRA on the head, SGD at 5.0, temperature 0.5: the draws deterministic by step 10, flat after | 120 | 77.0% -> 80.0% | 12 / 9 | 0.66 |
| LoRA on the head, SGD at 2.0, temperature 1 (the run file) | 120 | 77.0% -> 79.0% | 3 / 1 | 0.63 |

Commands: `vlrl run --config bench/learning/two-images.toml` with `--set` of what each row changes
(`model.lora_targets=layers training.optim= training.recipe=gspo training.learning_rate=1e-3
training.weight_decay=-1` for the layers rows, `training.temperature=0.5`, `training.max_steps=60`). While measuring
this, TRL's `frac_reward_zero_std` read 0 on steps where every group was flat (a float32 std of ~2.5e-7 for eight
equal weighted rewards): vlrl now counts flat groups itself (`vlrl.training.dynamic_sampling.flat_groups`)."""


def learning_entry(task: str, run_dir: Path) -> dict:
    """The task's row: accuracy before and after, the exact paired test, the one-picture baseline, the records."""
    folder = RESULTS.parent / "inputs" / task
    folder.mkdir(parents=True, exist_ok=True)
    kind = "samples" if (run_dir / "samples_before.jsonl").exists() else "eval"
    paths = {}
    for side in SIDES:
        name = f"{kind}_{side}.jsonl"
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, folder / name)
            paths[side] = folder / name
    c = compare(paths["before"], paths["after"])
    entry = {"task": task, "before": c["accuracy_before"], "after": c["accuracy_after"], "p_value": c["mcnemar_p"],
             "n": c["n_paired"], "wrong_to_right": len(c["wrong_to_right"]), "right_to_wrong": len(c["right_to_wrong"]),
             "before_records": _relative(paths["before"]), "after_records": _relative(paths["after"]),
             "notes": one_answer_notes(c), "config": _config(run_dir)}
    if kind == "samples":
        pk = c["pass_at_k"]
        entry["measure"] = f"the first of {pk['samples']} seeded draws per item at temperature 1 (McNemar), and pass@1"
        entry["pass_at_1"] = {"before": pk["pass_at_1_before"], "after": pk["pass_at_1_after"],
                              "p_value": pk["pass_at_1_p"], "learned": len(pk["learned"]),
                              "sharpened": len(pk["sharpened"]), "lost": len(pk["lost"])}
        greedy = compare(run_dir / "eval_before.jsonl", run_dir / "eval_after.jsonl")
        entry["greedy"] = {"before": greedy["accuracy_before"], "after": greedy["accuracy_after"],
                           "p_value": greedy["mcnemar_p"], "wrong_to_right": len(greedy["wrong_to_right"]),
                           "right_to_wrong": len(greedy["right_to_wrong"])}
    for mode, seen in ONE.items():
        if f"base_{mode}" not in paths or f"adapter_{mode}" not in paths:
            continue
        base, adapter = paths[f"base_{mode}"], paths[f"adapter_{mode}"]
        one, both_vs_one, after = compare(base, adapter), compare(base, paths["before"]), compare(adapter, paths["after"])
        entry["one_picture"] = {"seen": seen, "before": one["accuracy_before"], "after": one["accuracy_after"],
                                "p_value": one["mcnemar_p"], "before_records": _relative(base),
                                "after_records": _relative(adapter), "both_vs_one_p": both_vs_one["mcnemar_p"],
                                "trained_all_vs_one_p": after["mcnemar_p"]}
        if kind == "samples":
            entry["one_picture"]["pass_at_1"] = [one["pass_at_k"]["pass_at_1_before"],
                                                 one["pass_at_k"]["pass_at_1_after"]]
    return entry


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _config(run_dir: Path) -> dict:
    import tomllib

    return tomllib.loads((run_dir / "config.toml").read_text())


def markdown(results: dict) -> str:
    lines = ["# Inputs beyond one picture (issue 48)", "",
             "## Learning: the tiny Qwen3-VL on CPU, before and after GSPO, on held-out items", "",
             ("| task | items | before | after | exact McNemar p | wrong->right / right->wrong | one picture (or "
             "frame) seen: before -> after |"), "|---|---|---|---|---|---|---|"]
    for e in results.get("learning", []):
        one = e.get("one_picture")
        seen = (f"{one['before']:.1%} -> {one['after']:.1%} (p = {one['p_value']:.3g}); both against one before: "
                f"p = {one['both_vs_one_p']:.3g}" if one else "-")
        if one and "trained_all_vs_one_p" in one:
            seen = f"{one['seen']}: {seen}; both against one after: p = {one['trained_all_vs_one_p']:.3g}"
        lines.append(f"| {e['task']} | {e['n']} | {e['before']:.1%} | {e['after']:.1%} | {e['p_value']:.3g} | "
                     f"{e['wrong_to_right']} / {e['right_to_wrong']} | {seen} |")
    for e in results.get("learning", []):
        verdict = "a significant gain" if e["p_value"] < 0.01 else "no significant gain (p >= 0.01)"
        measured = []
        if e.get("pass_at_1"):
            pk, g = e["pass_at_1"], e["greedy"]
            measured = [(f"Measured on {e['measure']}: pass@1 {pk['before']:.1%} -> {pk['after']:.1%} (paired "
                        f"permutation p = {pk['p_value']:.3g}; {pk['learned']} items learned, {pk['sharpened']} "
                        f"sharpened, {pk['lost']} lost). Greedy: {g['before']:.1%} -> {g['after']:.1%} "
                        f"({g['wrong_to_right']} / {g['right_to_wrong']}, p = {g['p_value']:.3g}).")]
        notes = [f"{note}." for note in e.get("notes", [])]
        lines += ["", " ".join([f"**{e['task']}**: {verdict}.", *measured, *notes])]
    for e in results.get("learning", []):
        if e.get("seeds"):
            lines += seeds_table(e)
    lines += ["", READING]
    lines += gpu_table(results.get("gpu", []))
    lines += ["", ("Records: bench/results/inputs/<task>/ (samples_before, samples_after; samples_base_first and "
              "samples_adapter_first: the same items and draws with each item's second picture blanked, `vlrl eval "
              "--images first --samples 8`; for video samples_base_still and samples_adapter_still, each clip's "
              "middle frame held, `--images still`); the warmN rows' greedy records are in git, at the commits "
              "inputs.json names. Commands: bench/inputs_learning.py's docstring."), ""]
    return "\n".join(lines)


def seed_row(run_dir: Path) -> dict:
    """One training seed's figures from its run directory (its records stay there: bench/ keeps numbers, not runs)."""
    row = {"seed": _config(run_dir)["training"]["seed"], "run": run_dir.name}
    for kind in ("samples", "eval"):
        c = compare(run_dir / f"{kind}_before.jsonl", run_dir / f"{kind}_after.jsonl")
        row[kind] = {"before": c["accuracy_before"], "after": c["accuracy_after"], "p_value": c["mcnemar_p"],
                     "wrong_to_right": len(c["wrong_to_right"]), "right_to_wrong": len(c["right_to_wrong"])}
        if kind == "samples":
            pk = c["pass_at_k"]
            row["pass_at_1"] = {"before": pk["pass_at_1_before"], "after": pk["pass_at_1_after"],
                                "p_value": pk["pass_at_1_p"]}
    return row


def seeds_table(entry: dict) -> list[str]:
    title = (f"**{entry['task']}** under each training seed (`--set training.seed=S`, the same held-out items and "
             "draws):")
    header = ("| training seed | first draw before -> after | gained / lost | McNemar p | pass@1 before -> after | "
              "permutation p | greedy before -> after (p) |")
    lines = ["", title, "", header, "|---|---|---|---|---|---|---|"]
    for r in entry["seeds"]:
        s, pk, g = r["samples"], r["pass_at_1"], r["eval"]
        lines.append(f"| {r['seed']} | {s['before']:.1%} -> {s['after']:.1%} | {s['wrong_to_right']} / "
                     f"{s['right_to_wrong']} | {s['p_value']:.2g} | {pk['before']:.1%} -> {pk['after']:.1%} | "
                     f"{pk['p_value']:.2g} | {g['before']:.1%} -> {g['after']:.1%} ({g['p_value']:.2g}) |")
    significant = sum(r["samples"]["p_value"] < 0.01 and r["samples"]["after"] > r["samples"]["before"]
                      for r in entry["seeds"])
    lines += ["", f"{significant} of {len(entry['seeds'])} seeds gained significantly on the first draw (p < 0.01)."]
    return lines


def save(results: dict) -> None:
    """inputs.json and the page made from it."""
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    RESULTS.with_suffix(".md").write_text(markdown(results))


def main(task: str, run_dir: str, *seed_runs: str) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"learning": [], "gpu": []}
    results["learning"] = [e for e in results.get("learning", []) if e["task"] != task]
    entry = learning_entry(task, Path(run_dir))
    if seed_runs:
        entry["seeds"] = sorted((seed_row(Path(d)) for d in (run_dir, *seed_runs)), key=lambda r: r["seed"])
    results["learning"].append(entry)
    results.setdefault("gpu", [])
    save(results)
    print(markdown(results))


GPU_COMMAND = ("python bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --inputs 2-images 16-frames "
               "1-image --steps 1 --generation-batch 16 --micro-batch 4")
GPU_READING = """The 8B shape (Qwen3-VL-8B's config, random weights, the NF4 base decoded from int8), the preset's batch: 32
completions of 1,024 tokens a step, 16 decoded at once, micro-batches of 4; 512x512 pictures. `2-images`: two charts
an item (`two_chart_compare`; the multi-image preset is `qwen3-vl-8b-mathvista --set data.max_images=2`); `16-frames`:
a 16-frame clip of 512x512 frames an item, scaled by the processor's video budget to 16 x 256 x 256 pixels
(`--set data.video_max_pixels=1048576`: 512 video tokens); `1-image`: the MathVista preset's input, for reference.
Speed and the first reserved column come from one call with nothing else on the GPU; that process started CUDA
before vlrl's loader could set PyTorch's expandable segments, so its allocator cached fixed blocks. The second
reserved column comes from the same rows in an earlier call, with expandable segments on (what `vlrl run` sets), run
beside the tiny learning runs of bench/results/seeds.md (their speed there was 69-73% of this table's; memory is the
process's own). Within 22 GiB reserved: the two-picture row, with expandable segments. The clip row and the
one-picture row reserve 24.2 and 24.9 GiB for 17.5 and 18.1 GiB allocated: a 24 GB card holds them only if the
allocator's slack fits, which the hard cap (`[model] memory_cap_gib`) shows: below."""


def gpu_rows(alone: Path, expandable: Path) -> list[dict]:
    """One row per input from bench/gpu_engine.py's result files: speed and memory from the call alone on the GPU,
    the reserved peak with expandable segments from the other call."""
    rows = []
    for path in sorted(alone.glob("gspo_*.json")):
        r = json.loads(path.read_text())
        other = json.loads((expandable / path.name).read_text()) if (expandable / path.name).exists() else {}
        rows.append({"input": r.get("input", "1-image").replace("-", " "), "completion": r["completion"],
                     "generation_batch": r["generation_batch"], "micro_batch": r["micro_batch"],
                     "completion_tokens_per_s": r["completion_tokens_per_s"], "step_s": r["step_s"],
                     "generation_s": r["generation_s"], "decode_bound_share": r["decode_bound_share"],
                     "max_reserved_gib": other.get("max_reserved_gib", r["max_reserved_gib"]),
                     "max_reserved_gib_default_allocator": r["max_reserved_gib"],
                     "max_allocated_gib": r["max_allocated_gib"], "rollout_train_kl": r["rollout_train_kl"],
                     "gpu": r["gpu"], "command": GPU_COMMAND})
    return rows


def gpu_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "## GPU: the 8B preset path at 1,024 tokens, by input", "", f"    {GPU_COMMAND}", "",
             ("| input | completion tok/s | step s | generation s | decode / bound | GiB reserved (alone) | GiB reserved "
             "(expandable segments) | GiB allocated |"), "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['input']} | {r['completion_tokens_per_s']:.1f} | {r['step_s']:.2f} | "
                     f"{r['generation_s']:.2f} | {r['decode_bound_share']:.1%} | "
                     f"{r['max_reserved_gib_default_allocator']:.1f} | {r['max_reserved_gib']:.1f} | "
                     f"{r['max_allocated_gib']:.1f} |")
    lines += ["", GPU_READING]
    capped = [r for r in rows if r.get("capped")]
    if capped:
        cap = capped[0]["capped"]["cap_gib"]
        lines += ["", (f"Under a hard cap of {cap:g} GiB (`{CAPPED_COMMAND}`, in lane 4 of `bash bench/capped.sh`, "
                       "beside other presets' runs: its speed there is not this table's; bench/results/capped.md), the "
                       "same steps ran with no out-of-memory error:"), ""]
        lines += [f"- {r['input']}: {r['capped']['max_reserved_gib']:.2f} GiB reserved at most "
                  f"({r['capped']['max_allocated_gib']:.2f} allocated); the process as nvidia-smi saw it: "
                  f"{r['capped']['process_peak_gib']} GiB, the CUDA context and libraries loaded after the cap counted"
                  for r in capped]
    return lines

CAPPED_COMMAND = ("python bench/gpu_engine.py --size 8b --checkpoint CKPT --completion 1024 --paths vlrl-int8 "
                  "--inputs 16-frames 2-images --steps 1 --memory-cap-gib 22")


def archive_main(task: str, name: str, commit: str) -> None:
    """Keeps `task`'s entry as `name`, its records read back with `git show <commit>:<path>` (the commit that holds
    them), before a new run file's records replace the files under bench/results/inputs/<task>/."""
    results = json.loads(RESULTS.read_text())
    for entry in results["learning"]:
        if entry["task"] == task:
            entry["task"] = name
            for side in (entry, entry.get("one_picture", {})):
                for key in ("before_records", "after_records"):
                    if key in side and not side[key].startswith("git show"):
                        side[key] = f"git show {commit}:{side[key]}"
    save(results)


def gpu_main(alone: str, expandable: str) -> None:
    results = json.loads(RESULTS.read_text())
    results["gpu"] = gpu_rows(Path(alone), Path(expandable))
    save(results)


def gpu_capped_main(capped_runs: str = "bench/results/capped_runs.json", engine_pid: str = "") -> None:
    """Adds to each GPU row its run under a hard cap (bench/capped.sh's lane 4, packed in capped_runs.json);
    `engine_pid`: gpu_engine.py's process id where its results lack one, for its nvidia-smi peak."""
    results = json.loads(RESULTS.read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from capped_results import engine_rows, process_peaks

    runs = json.loads(Path(capped_runs).read_text())
    capped = {r["input"]: r for r in engine_rows(runs, process_peaks(runs), int(engine_pid) if engine_pid else None)}
    for row in results["gpu"]:
        if row["input"] in capped:
            row["capped"] = {**capped[row["input"]], "out_of_memory": False}
    save(results)


if __name__ == "__main__":
    commands = {"gpu": gpu_main, "gpu-capped": gpu_capped_main, "archive": archive_main}
    command = commands.get(sys.argv[1] if len(sys.argv) > 1 else "")
    (command or main)(*sys.argv[1 + bool(command):])
