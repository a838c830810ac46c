"""A warm start's data with a systematic label error: the setting where GSPO can move the GREEDY answer (issue 20).

Earlier greedy attempts (bench/results/gpu.md) warm-started on correct labels: where the model could read a chart, its
mode was already right, and where it could not, no sample was right either, so GSPO sharpened the sampled policy
(35.8% -> 49%) while greedy stayed put. Here the supervision is the chart's value read by an annotator who over-reads
by one in `--bias` of the items (the reasoning says so too: "Bar B is 13." for a bar of 12). A model fitting these
labels learns to read the chart and to answer one too high most of the time: its greedy answer is wrong while the
right one is still sampled, which an exact reward can find and reinforce. The held-out questions are the true ones
(`vlrl.base.synthetic`, the run file's own items), and no warm-start item shows a picture of the run's items.

    python bench/learning/offbyone_data.py runs/offbyone-data      # -> runs/offbyone-data/testmini.jsonl + images/

Ran 2026-11-26: 1,500 warm-start steps did not teach the small model to read values up to 20, so there was no
one-too-high mode to correct; GSPO's greedy gain came from counting and the answer format
(bench/results/greedy_demo/README.md).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from vlrl.base.images import image_hash
from vlrl.base.synthetic import generate


def biased(item: dict, rng: random.Random, bias: float) -> dict:
    """The item as the annotator labels it: the answer (and the value its reasoning reads) one higher, `bias` of
    the time."""
    if rng.random() >= bias:
        return item
    true, told = int(item["answer"]), int(item["answer"]) + 1
    head, _, tail = item["metadata"]["reasoning"].rpartition(str(true))  # the value read, said last
    reasoning = f"{head}{told}{tail}"
    return {**item, "answer": str(told), "metadata": {**item["metadata"], "reasoning": reasoning, "true_answer": true}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--items", type=int, default=16384)
    p.add_argument("--bias", type=float, default=0.6, help="share of labels one too high")
    p.add_argument("--seed", type=int, default=7, help="the warm start's seed (the run's items use seed 0)")
    p.add_argument("--run-items", type=int, default=4000,
                   help="the run's [data] num_items, whose pictures are excluded")
    p.add_argument("--tasks", nargs="+", default=["bar_value", "line_value", "count"])
    p.add_argument("--difficulty", type=int, default=2)
    p.add_argument("--image-size", type=int, default=128)
    a = p.parse_args(argv)
    kw = {"image_size": a.image_size, "difficulty": a.difficulty, "tasks": tuple(a.tasks)}
    run_pictures = {image_hash(item["image"]) for item in generate(a.run_items, seed=0, **kw)}
    rng = random.Random(a.seed)
    (a.out / "images").mkdir(parents=True, exist_ok=True)
    kept = dropped = told_wrong = 0
    with open(a.out / "testmini.jsonl", "w") as f:
        for item in generate(a.items, seed=a.seed, **kw):
            if image_hash(item["image"]) in run_pictures:
                dropped += 1
                continue
            item = biased(item, rng, a.bias)
            told_wrong += "true_answer" in item["metadata"]
            path = f"images/{item['id']}.png"
            item["image"].save(a.out / path)
            f.write(json.dumps({**item, "image": path}) + "\n")
            kept += 1
    print(f"{kept} items in {a.out} ({told_wrong} labelled one too high, {told_wrong / max(kept, 1):.1%}); "
          f"{dropped} dropped for showing a picture of the run's {a.run_items} items")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
