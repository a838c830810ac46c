"""Preprocessing throughput of vlrl.data: images per second, first load (cold) and again (datasets' cache hit).

    python bench/bench_data.py                      # 300 items, writes bench/results/bench_data.{json,md}
    python bench/bench_data.py --items 1000 --num-proc 2

It draws a MathVista-like set (MathVista's JSON layout and the hub's parquet layout, the same items): charts of
400-1200 px saved as PNG and photo-like JPEGs of 800-2400 px, as MathVista mixes them. Then it times, each in a fresh
datasets cache and again on the warm cache:

- load_mathvista(..., image_size=512) from the JSON layout and from the parquet layout (decode, convert, resize to
  512x512, encode into Arrow; numeric filter), with each `image_format` (png, the default; bmp; jpeg) on the JSON
  layout;
- to_dataset + filter_by_length with the tiny Qwen3-VL processor (Qwen3-VL's image settings), 512 px: prompts/s,
  against running the processor on every prompt (prompt_tokens), which the filter's LengthMeter must match exactly;
- iterating the loaded Dataset, decoding every image (what a consumer pays after a warm load);
- split_holdout on the loaded Dataset (content hashes of every picture): rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import datasets
import numpy as np
from PIL import Image

from data.make_mathvista_sample import write_hub_layout
from vlrl import data
from vlrl.base import synthetic

RESULTS = Path(__file__).resolve().parent / "results"
NOTES = """
Notes:
- cold = first load into an empty datasets cache: read, decode, convert, resize to 512x512, encode into Arrow.
  warm = the same call again: datasets finds the fingerprinted result and reads no pixels (rows/s of the load).
  iterate_decoding_images = what a consumer then pays to decode each cached image.
- The parquet layout's cache also holds datasets' Arrow copy of the source parquet (the hub path does the same).
- image_format: png (default, lossless, compact), bmp (lossless, 768 KiB per image), jpeg (q95 4:4:4, lossy).
- filter_by_length uses LengthMeter: the processor on the first two prompts of each image size, then the tokenizer
  plus the learned image-token count; the bench asserts it equals prompt_tokens (the processor on every prompt).
- The load average is recorded: on a shared machine the absolute numbers are pessimistic; compare within a run.
"""


def make_source(root: Path, n: int, seed: int = 0) -> None:
    """n items in MathVista's JSON layout under root/json and the hub's parquet layout under root/parquet."""
    rng = random.Random(seed)
    items = synthetic.generate(n, seed=seed, image_size=256, tasks="all", difficulty=2)
    (root / "json" / "images").mkdir(parents=True)
    records = {}
    for pid, item in enumerate(items, 1):
        if pid % 3 == 0:  # photo-like: large noisy JPEGs (the slow case to decode)
            w = rng.randint(800, 2400)
            h = int(w * rng.uniform(0.6, 1.0))
            noise = np.random.default_rng(pid).integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
            image = Image.fromarray(noise).resize((w, h), Image.Resampling.BILINEAR)
            name = f"{pid}.jpg"
            image.save(root / "json" / "images" / name, quality=85)
        else:  # charts: upscaled drawings as PNG
            w = rng.randint(400, 1200)
            image = item["image"].resize((w, int(w * rng.uniform(0.6, 1.0))), Image.Resampling.BICUBIC)
            name = f"{pid}.png"
            image.save(root / "json" / "images" / name)
        records[str(pid)] = {"question": item["question"], "image": f"images/{name}", "choices": item["choices"],
                             "unit": item["unit"], "precision": None, "answer": item["answer"],
                             "question_type": item["question_type"], "answer_type": "integer", "pid": str(pid),
                             "metadata": {"source": "bench", "img_width": image.width, "img_height": image.height},
                             "query": item["question"]}
    (root / "json" / "testmini.json").write_text(json.dumps(records))
    write_hub_layout(root / "json", root / "parquet")


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--num-proc", type=int, default=None)
    parser.add_argument("--length-items", type=int, default=100, help="prompts measured by the length filter")
    parser.add_argument("--output", default=str(RESULTS / "bench_data"))
    args = parser.parse_args()
    datasets.disable_progress_bars()

    work = Path(tempfile.mkdtemp(prefix="vlrl-bench-data-"))
    results = {"items": args.items, "num_proc": args.num_proc, "image_size": 512,
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "processor": platform.processor() or platform.machine(),
                           "datasets": datasets.__version__, "pillow": Image.__version__,
                           "load_average_at_start": [round(x, 1) for x in os.getloadavg()]},
               "command": "python bench/bench_data.py " + " ".join(sys.argv[1:])}
    try:
        _, seconds = timed(lambda: make_source(work, args.items))
        sizes = [p.stat().st_size for p in (work / "json" / "images").iterdir()]
        results["source"] = {"seconds_to_draw": round(seconds, 1), "encoded_mb": round(sum(sizes) / 2**20, 1)}
        print(f"drew {args.items} items ({results['source']['encoded_mb']} MB of PNG/JPEG) in {seconds:.0f} s")

        runs = [("json", "png"), ("parquet", "png"), ("json", "bmp"), ("json", "jpeg")]
        for layout, image_format in runs:
            cache = work / f"cache-{layout}-{image_format}"
            for phase in ("cold", "warm"):
                (ds, report), seconds = timed(partial(
                    data.load_mathvista, str(work / layout), image_size=512, return_report=True, cache_dir=str(cache),
                    image_format=image_format, num_proc=args.num_proc, log=lambda _: None))
                cache_mb = sum(p.stat().st_size for p in cache.rglob("*.arrow")) / 2**20
                results[f"load_{layout}_{image_format}_{phase}"] = {
                    "seconds": round(seconds, 3), "images_per_second": round(report.rows_read / seconds, 1),
                    "rows_kept": report.rows_kept, "cache_mb": round(cache_mb, 1)}
                print(f"load_mathvista {layout:7s} {image_format:4s} {phase}: {seconds:7.2f} s  "
                      f"{report.rows_read / seconds:8.1f} images/s  ({report.rows_kept} kept, cache {cache_mb:.0f} MB)")
        ds = data.load_mathvista(str(work / "json"), image_size=512, cache_dir=str(work / "cache-json-png"),
                                 log=lambda _: None)
        # A warm load reads no pixels; a consumer decodes each image as it iterates. That costs this much:
        _, seconds = timed(lambda: [row["image"].load() for row in ds])
        results["iterate_decoding_images_png"] = {"seconds": round(seconds, 3),
                                                  "images_per_second": round(len(ds) / seconds, 1)}
        print(f"iterating the loaded Dataset, decoding every image: {len(ds) / seconds:.1f} images/s")

        from transformers import AutoProcessor

        from vlrl.model import lengths, prompts
        from vlrl.training.warmstart import ensure_tiny

        processor = AutoProcessor.from_pretrained(ensure_tiny(warm_start_steps=0))
        subset = ds.select(range(min(args.length_items, len(ds))))
        rows, seconds_prompts = timed(lambda: prompts.to_dataset(subset))
        exact, seconds_exact = timed(lambda: [lengths.prompt_tokens(processor, row) for row in rows])
        results["prompt_tokens_each_with_processor"] = {"rows": len(rows), "seconds": round(seconds_exact, 3),
                                                        "prompts_per_second": round(len(rows) / seconds_exact, 1)}
        meter = lengths.LengthMeter(processor)
        assert [meter(row) for row in rows] == exact  # the fast path counts exactly what the processor counts
        (_kept, dropped), seconds = timed(lambda: lengths.filter_by_length(rows, processor, 1024))
        results["to_dataset"] = {"rows": len(subset), "seconds": round(seconds_prompts, 3),
                                 "rows_per_second": round(len(subset) / seconds_prompts, 1)}
        results["filter_by_length"] = {"rows": len(rows), "seconds": round(seconds, 3),
                                       "prompts_per_second": round(len(rows) / seconds, 1), "dropped": dropped}
        print(f"to_dataset: {len(subset) / seconds_prompts:.1f} rows/s; prompt_tokens (processor on every prompt): "
              f"{len(rows) / seconds_exact:.1f} prompts/s; filter_by_length (512 px, 256 image tokens each): "
              f"{len(rows) / seconds:.1f} prompts/s")

        _, seconds = timed(lambda: data.split_holdout(ds, n=min(100, len(ds) // 3), seed=0))
        results["split_holdout"] = {"rows": len(ds), "seconds": round(seconds, 3),
                                    "rows_per_second": round(len(ds) / seconds, 1)}
        print(f"split_holdout: {len(ds) / seconds:.1f} rows/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results["machine"]["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]  # a shared machine shows here
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# vlrl.data preprocessing throughput ({args.items} MathVista-like items, 512x512 output)", "",
             f"Command: `{results['command']}`  ", f"Machine: {results['machine']}", "",
             "| step | seconds | throughput | datasets cache |", "|---|---|---|---|"]
    for key, value in results.items():
        if isinstance(value, dict) and "seconds" in value:
            rate = next((f"{v} {k.replace('_per_second', '/s')}" for k, v in value.items() if "per_second" in k), "")
            cache_mb = f"{value['cache_mb']} MB" if "cache_mb" in value else ""
            lines.append(f"| {key} | {value['seconds']} | {rate} | {cache_mb} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n" + NOTES)
    print(f"results -> {out.with_suffix('.json')}, {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
