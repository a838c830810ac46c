"""Data for a GPU rehearsal, in the real layouts at the real sizes, with generated pictures (nothing downloaded).

    python bench/rehearsal_data.py mathvista DIR           # MathVista testmini: its 1,000 real annotations
    python bench/rehearsal_data.py mathvista DIR --items 16  # 16 of them, spread evenly (a rehearsal's short eval)
    python bench/rehearsal_data.py virl39k DIR [--items N]  # ViRL39K's layout: N rows (default 38,870, the release's)

MathVista: `DIR/testmini.jsonl` holds the real annotations of ../shared/data (question, choices, unit, precision,
answer, metadata), and `DIR/images/<pid>.jpg` a drawn chart at each item's own width and height (its metadata's
img_width x img_height), so the processor makes each item's real number of image tokens and the length filter sees
the real prompts. ViRL39K: `DIR/39Krelease.parquet` with the release's columns and `DIR/images/` unzipped beside it,
the answers `\\boxed{...}` integers; the release publishes no picture sizes, so its pictures take MathVista's sizes in
turn. The run points at them with `--set data.source=DIR` / `--set eval.source=DIR`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# ../shared/data beside the checkout; on the GPU machine a copy carried in the checkout's .rehearsal/
ANNOTATIONS = next((p for p in (ROOT.parent / "shared" / "data", ROOT / ".rehearsal")
                    if (p / "mathvista_testmini_annotations.jsonl.gz").exists()), ROOT / ".rehearsal") \
    / "mathvista_testmini_annotations.jsonl.gz"
VIRL39K_ITEMS = 38_870  # the release's rows with a verifiable answer


def annotations(path: Path = ANNOTATIONS) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def draw(job: tuple[str, int, int, int]) -> str:
    """A bar chart drawn at (width, height), saved as JPEG: what a chart picture costs to read and encode."""
    from vlrl.base import synthetic

    path, width, height, seed = job
    rng = random.Random(seed)
    side = max(64, min(width, height, 1024))
    picture = synthetic._bar_chart([rng.randint(1, 12) for _ in range(4)], side).convert("RGB")
    picture.resize((max(1, width), max(1, height))).save(path, format="JPEG", quality=85)
    return path


def sizes(items: list[dict]) -> list[tuple[int, int]]:
    return [(int(i["metadata"]["img_width"]), int(i["metadata"]["img_height"])) for i in items]


def mathvista(out: Path, workers: int, count: int | None = None) -> None:
    items = annotations()
    if count:  # every k-th item: the subset keeps the spread of picture sizes and question types
        items = items[::max(1, len(items) // count)][:count]
    (out / "images").mkdir(parents=True, exist_ok=True)
    with (out / "testmini.jsonl").open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps({**item, "image": f"images/{item['pid']}.jpg"}) + "\n")
    jobs = [(str(out / "images" / f"{item['pid']}.jpg"), w, h, n) for n, (item, (w, h)) in
            enumerate(zip(items, sizes(items)))]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(draw, jobs, chunksize=16))
    print(f"mathvista: {len(items)} items, pictures at their real sizes, in {out}")


def virl39k(out: Path, count: int, workers: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    real = sizes(annotations())
    rng = random.Random(39)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows, jobs = [], []
    for n in range(count):
        path = f"images/Processed-rehearsal-{n:05d}-0.jpg"
        w, h = real[n % len(real)]
        jobs.append((str(out / path), w, h, 1_000_000 + n))  # other pictures than MathVista's: no overlap dropped
        rows.append({"qid": f"rehearsal-{n}", "question": "<image>What is the value of the tallest bar?",
                     "answer": f"\\boxed{{{rng.randint(1, 12)}}}", "image": [path], "category": "(Chart) Bar",
                     "source": "rehearsal", "PassRate_32BTrained": 0.5, "PassRate_7BBase": None})
    schema = pa.schema([("qid", pa.string()), ("question", pa.string()), ("answer", pa.string()),
                        ("image", pa.list_(pa.string())), ("category", pa.string()), ("source", pa.string()),
                        ("PassRate_32BTrained", pa.float64()), ("PassRate_7BBase", pa.float64())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / "39Krelease.parquet")
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(draw, jobs, chunksize=64))
    print(f"virl39k: {count} rows in the release's layout, in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["mathvista", "virl39k"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--items", type=int, default=None,
                        help=f"virl39k: rows (default {VIRL39K_ITEMS:,}); mathvista: a subset (default all 1,000)")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    if args.what == "mathvista":
        mathvista(args.out, args.workers, args.items)
    else:
        virl39k(args.out, args.items or VIRL39K_ITEMS, args.workers)


if __name__ == "__main__":
    main()
