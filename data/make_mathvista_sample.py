"""Draws data/mathvista_sample/: 40 items in MathVista's own JSON layout, drawn here (nothing copied from MathVista).

    python data/make_mathvista_sample.py                  # rewrites testmini.json and images/ deterministically
    python data/make_mathvista_sample.py --hub /tmp/mv    # also writes the sample in the hub's parquet layout

The layout is MathVista's: `testmini.json` keyed by pid, each record with `image: "images/<pid>.<ext>"`, question,
choices, unit, precision, answer, question_type, answer_type, metadata and query. The mix is MathVista's too, so a
load exercises every path of `vlrl.data.load_mathvista`:

- free-form integers (bar/line charts, counts, geometry), some with a unit;
- floats with a precision (averages and ratios);
- multi-choice items whose options are numbers (kept under numeric_only, their prompt shows the options);
- multi-choice items with text options, free-form text and list answers (skipped and counted under numeric_only);
- images of several sizes (not square), PNG (palette and RGBA) and JPEG (RGB, grayscale, CMYK).

`write_hub_layout` rewrites a data set in that JSON layout as AI4Math/MathVista's hub layout (parquet with the image
bytes in `decoded_image`, the columns of `hub_features()`); the tests and bench/bench_data.py load both layouts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vlrl.base import synthetic

OUT = Path(__file__).resolve().parent / "mathvista_sample"
SEED = 2024


def hint(question_type: str, answer_type: str, precision) -> str:
    """MathVista's `query` hint for an item of this kind."""
    if question_type == "multi_choice":
        return "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end."
    if answer_type == "integer":
        return ("Hint: Please answer the question requiring an integer answer and provide the final value, "
                "e.g., 1, 2, 3, at the end.")
    if answer_type == "float":
        places = {1: "one decimal place", 2: "two decimal places"}[int(precision)]
        example = {1: "1.2, 1.3, 1.4", 2: "1.23, 1.34, 1.45"}[int(precision)]
        return (f"Hint: Please answer the question requiring a floating-point number with {places} and provide the "
                f"final value, e.g., {example}, at the end.")
    if answer_type == "list":
        return "Hint: Please answer the question requiring a Python list as an answer and provide the final list."
    return "Hint: Please answer the question and provide the final answer at the end."


def framed(image: Image.Image, title: str, rng: random.Random) -> Image.Image:
    """Puts a square drawing on a wider canvas with a title strip: MathVista's figures are rarely square."""
    width = image.width + rng.choice([0, 40, 80, 120])
    canvas = Image.new("RGB", (width, image.height + 28), "white")
    canvas.paste(image, ((width - image.width) // 2, 28))
    ImageDraw.Draw(canvas).text((width // 2, 14), title, fill="black", font=synthetic._font(14), anchor="mm")
    return canvas


def bar_values(rng: random.Random, n: int = 4, high: int = 12) -> list[int]:
    return [rng.randint(1, high) for _ in range(n)]


def extra_items(rng: random.Random) -> list[dict]:
    """MathVista kinds the synthetic tasks do not cover: floats, 4-option numeric and text choices, text, lists."""
    items = []
    for _ in range(3):  # float answers with a precision
        values = bar_values(rng)
        a, b = rng.sample(range(4), 2)
        mean = (values[a] + values[b]) / 2
        items.append({"question": f"What is the average of bars {'ABCD'[a]} and {'ABCD'[b]}?",
                          "image": synthetic._bar_chart(values, 256), "answer": f"{mean:.1f}", "answer_type": "float",
                          "precision": 1.0, "context": "bar chart", "skills": ["statistical reasoning"]})
    for _ in range(2):
        values = bar_values(rng)
        a, b = rng.sample(range(4), 2)
        items.append({"question": f"What is the ratio of bar {'ABCD'[a]} to bar {'ABCD'[b]}?",
                          "image": synthetic._bar_chart(values, 256), "answer": f"{values[a] / values[b]:.2f}",
                          "answer_type": "float", "precision": 2.0, "context": "bar chart",
                          "skills": ["statistical reasoning", "arithmetic reasoning"]})
    for _ in range(4):  # multi-choice with four numeric options
        values = bar_values(rng)
        a = rng.randrange(4)
        options = sorted({values[a], values[a] + 1, max(0, values[a] - 1), values[a] + 2})[:4]
        while len(options) < 4:
            options.append(options[-1] + 1)
        items.append({"question": f"What is the value of bar {'ABCD'[a]}?", "image": synthetic._bar_chart(values, 256),
                          "answer": str(values[a]), "answer_type": "integer", "question_type": "multi_choice",
                          "choices": [str(o) for o in options], "context": "bar chart",
                          "skills": ["figure question answering"]})
    for _ in range(3):  # multi-choice with text options (skipped under numeric_only)
        values = bar_values(rng)
        a, b = rng.sample(range(4), 2)
        answer = "Yes" if values[a] > values[b] else "No"
        items.append({"question": f"Is bar {'ABCD'[a]} taller than bar {'ABCD'[b]}?",
                          "image": synthetic._bar_chart(values, 256), "answer": answer, "answer_type": "text",
                          "question_type": "multi_choice", "choices": ["Yes", "No"], "context": "bar chart",
                          "skills": ["statistical reasoning"]})
    for _ in range(2):  # free-form text (skipped under numeric_only)
        values = bar_values(rng)
        values[rng.randrange(4)] = 13  # one clear maximum
        items.append({"question": "Which bar is the tallest? Answer with its letter.",
                          "image": synthetic._bar_chart(values, 256), "answer": "ABCD"[values.index(13)],
                          "answer_type": "text", "context": "bar chart", "skills": ["figure question answering"]})
    for _ in range(2):  # list answers (skipped under numeric_only)
        values = bar_values(rng)
        items.append({"question": "List the values of bars A and B.", "image": synthetic._bar_chart(values, 256),
                          "answer": f"[{values[0]}, {values[1]}]", "answer_type": "list", "context": "bar chart",
                          "skills": ["figure question answering"]})
    return items


def synthetic_items(rng: random.Random) -> list[dict]:
    items = []
    for n, item in enumerate(synthetic.generate(24, seed=SEED, image_size=256, tasks="all", difficulty=2)):
        task = item["metadata"]["task"]
        context = ("bar chart" if task.startswith("bar") else "line plot" if task.startswith("line") else
                   "abstract scene" if task.startswith("count") else "geometry diagram")
        items.append({"question": item["question"], "image": item["image"], "answer": item["answer"],
                          "answer_type": "integer", "question_type": item["question_type"], "choices": item["choices"],
                          "unit": item["unit"], "context": context, "skills": item["metadata"]["skills"]})
    return items


def hub_features():
    """AI4Math/MathVista's columns on the hub, as `datasets.Features` (metadata keys a record lacks are null)."""
    import datasets

    text = datasets.Value("string")
    return datasets.Features({
        "pid": text, "question": text, "image": text, "decoded_image": datasets.Image(),
        "choices": datasets.List(text), "unit": text, "precision": datasets.Value("float64"), "answer": text,
        "question_type": text, "answer_type": text,
        "metadata": {"split": text, "source": text, "task": text, "context": text, "grade": text,
                     "img_width": datasets.Value("int64"), "img_height": datasets.Value("int64"), "language": text,
                     "skills": datasets.List(text), "category": text},
        "query": text,
    })


def write_hub_layout(json_dir: Path, out_dir: Path, split: str = "testmini") -> Path:
    """Rewrites `json_dir/<split>.json` (MathVista's JSON layout) as the hub's layout under `out_dir`:
    data/<split>-00000-of-00001.parquet, each record's image file read into `decoded_image`. Returns that file."""
    import datasets

    json_dir, out_dir = Path(json_dir), Path(out_dir)
    records = json.loads((json_dir / f"{split}.json").read_text())
    rows = [{**r, "decoded_image": {"bytes": (json_dir / r["image"]).read_bytes(), "path": r["image"]}}
            for r in records.values()]
    path = out_dir / "data" / f"{split}-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows, features=hub_features()).to_parquet(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hub", type=Path, help="also write the sample in the hub's parquet layout here")
    args = parser.parse_args()
    rng = random.Random(SEED)
    items = synthetic_items(rng) + extra_items(rng)
    order = list(range(len(items)))
    rng.shuffle(order)
    (OUT / "images").mkdir(parents=True, exist_ok=True)
    for old in (OUT / "images").glob("*"):
        old.unlink()
    records = {}
    for pid, index in enumerate(order, 1):
        item = items[index]
        image = framed(item["image"], f"Figure {pid}", rng)
        # Stored formats vary as MathVista's do: palette PNG mostly, some JPEG, one each RGBA, grayscale, CMYK.
        kind = {3: "rgba", 7: "gray", 11: "cmyk"}.get(pid, "jpeg" if pid % 5 == 0 else "png")
        if kind == "rgba":
            pixels = np.asarray(image.convert("RGBA")).copy()
            pixels[..., 3] = np.where((pixels[..., :3] == 255).all(axis=-1), 0, 255)  # transparent background
            rgba = Image.fromarray(pixels, mode="RGBA")
            name = f"{pid}.png"
            rgba.save(OUT / "images" / name, optimize=True)
        elif kind == "png":
            name = f"{pid}.png"
            image.quantize(colors=32).save(OUT / "images" / name, optimize=True)
        else:
            name = f"{pid}.jpg"
            converted = {"gray": "L", "cmyk": "CMYK"}.get(kind, "RGB")
            image.convert(converted).save(OUT / "images" / name, quality=70, optimize=True)
        question_type = item.get("question_type") or "free_form"
        precision = item.get("precision")
        query = f"{hint(question_type, item['answer_type'], precision)}\nQuestion: {item['question']}"
        if item.get("choices"):
            query += "\nChoices:\n" + "\n".join(f"({'ABCDEFG'[i]}) {c}" for i, c in enumerate(item["choices"]))
        records[str(pid)] = {
            "question": item["question"], "image": f"images/{name}", "choices": item.get("choices"),
            "unit": item.get("unit"), "precision": precision, "answer": item["answer"],
            "question_type": question_type, "answer_type": item["answer_type"], "pid": str(pid),
            "metadata": {"split": "testmini", "source": "vlrl-synthetic", "task": "figure question answering",
                         "context": item["context"], "grade": "elementary school", "img_width": image.width,
                         "img_height": image.height, "language": "english", "skills": item["skills"],
                         "category": "math-targeted-vqa"},
            "query": query,
        }
    (OUT / "testmini.json").write_text(json.dumps(records, indent=2) + "\n")
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{len(records)} items, {size / 1024:.0f} KiB -> {OUT}")
    if args.hub:
        print(f"hub layout -> {write_hub_layout(OUT, args.hub)}")


if __name__ == "__main__":
    main()
