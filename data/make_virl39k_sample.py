"""Draws data/virl39k_sample/: 8 made-up items in ViRL39K's exact layout (nothing copied from ViRL39K).

    python data/make_virl39k_sample.py        # rewrites 39Krelease.parquet, images/ and images.zip deterministically

The layout is TIGER-Lab/ViRL39K's hub repo: `39Krelease.parquet` beside `images.zip`, unzipped in place into
`images/`. The table's columns and value forms are the release's: `qid` (str), `question` (str, sometimes with
`<image>` placeholders), `answer` (str, always `\\boxed{...}`), `image` (a list of paths inside images.zip, such as
`images/Processed-<uuid>-0.jpg`), `category`, `source` (str), `PassRate_32BTrained` (float) and `PassRate_7BBase`
(float, null where the release has none). The mix exercises `vlrl.data.load_virl39k`: integer, degree, fraction,
root, letter and word answers, an item with two pictures and placeholders, one with a caption placeholder.
"""

from __future__ import annotations

import random
import sys
import uuid
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vlrl.base import synthetic

OUT = Path(__file__).resolve().parent / "virl39k_sample"
SEED = 39
COLUMNS = ["qid", "question", "answer", "image", "category", "source", "PassRate_32BTrained", "PassRate_7BBase"]


def items(rng: random.Random) -> list[dict]:
    """(question, answer, pictures, category, source) of each made-up item; pictures are PIL images."""
    bars = [rng.randint(2, 12) for _ in range(4)]
    return [
        ("<image>In the triangle shown, angle A is 63 degrees and angle B is 100 degrees. Find angle C.",
         "\\boxed{17^\\circ}", [synthetic._triangle(63, 100, 256)], "(GradeSchool) Geometric", "MMK12"),
        (f"What is the value of bar {'ABCD'[bars.index(max(bars))]}?", f"\\boxed{{{max(bars)}}}",
         [synthetic._bar_chart(bars, 320)], "(GradeSchool) Non-Geo Math", "LLaVA-OneVision"),
        ("The rectangle has sides 3 and 4. What fraction of its perimeter is its shorter side?", "\\boxed{\\frac{3}{14}}",
         [synthetic._rectangle(3, 4, 240)], "(GradeSchool) Geometric", "MM-Math"),
        ("<image>The legs of the right triangle are 2 and 2\\sqrt{2}. Find the hypotenuse.", "\\boxed{2\\sqrt{3}}",
         [synthetic._triangle(90, 45, 256)], "(GradeSchool) Geometric", "R1-OneVision"),
        ("Which bar is the tallest?\nA. A\nB. B\nC. C\nD. D", f"\\boxed{{{'ABCD'[bars.index(max(bars))]}}}",
         [synthetic._bar_chart(bars, 256)], "(Chart) Bar", "LLaVA-OneVision"),
        ("<image> <image>\nHow many shapes are there in the two pictures together?", "\\boxed{7}",
         [synthetic._shapes(3, 200, rng), synthetic._shapes(4, 200, rng)], "(Spatial) Counting", "M3CoT"),
        ("Is the line going up from the first point to the last one? Answer Yes or No.", "\\boxed{Yes}",
         [synthetic._line_chart([1, 3, 2, 6], 256)], "(Chart) Line", "LLaVA-OneVision"),
        ("How many squares are in the picture?", "\\boxed{5}", [synthetic._mixed_shapes(2, 5, 224, rng)],
         "(Spatial) Counting", "MV-Math"),
    ]


def rows(rng: random.Random) -> tuple[list[dict], dict]:
    """The table's rows and the pictures by their path inside images.zip."""
    table, pictures = [], {}
    for index, (question, answer, images, category, source) in enumerate(items(rng)):
        stem = uuid.UUID(int=rng.getrandbits(128), version=4)
        paths = [f"images/Processed-{stem}-{n}.jpg" for n in range(len(images))]
        pictures.update(zip(paths, images))
        table.append({"qid": f"{stem.hex[:8]}-{index}", "question": question, "answer": answer, "image": paths,
                      "category": category, "source": source, "PassRate_32BTrained": round(rng.random(), 4),
                      "PassRate_7BBase": round(rng.random(), 4) if index % 3 else None})
    return table, pictures


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table, pictures = rows(random.Random(SEED))
    (OUT / "images").mkdir(parents=True, exist_ok=True)
    for old in (OUT / "images").glob("*"):
        old.unlink()
    with zipfile.ZipFile(OUT / "images.zip", "w", zipfile.ZIP_STORED) as zipped:
        for path, image in pictures.items():
            image.convert("RGB").save(OUT / path, format="JPEG", quality=90)
            info = zipfile.ZipInfo(path, date_time=(2025, 4, 1, 0, 0, 0))  # fixed: the archive is byte-stable
            zipped.writestr(info, (OUT / path).read_bytes())
    schema = pa.schema([("qid", pa.string()), ("question", pa.string()), ("answer", pa.string()),
                        ("image", pa.list_(pa.string())), ("category", pa.string()), ("source", pa.string()),
                        ("PassRate_32BTrained", pa.float64()), ("PassRate_7BBase", pa.float64())])
    pq.write_table(pa.Table.from_pylist(table, schema=schema), OUT / "39Krelease.parquet")
    print(f"{len(table)} items, {len(pictures)} pictures -> {OUT}")


if __name__ == "__main__":
    main()
