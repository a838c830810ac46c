"""Record files on disk: JSONL records read back (a torn last line forgiven, any other damage refused) and the
eval images saved beside them, so a run directory alone is enough to show every item.

    records = read_records("runs/demo/eval_before.jsonl")
    image_paths("runs/demo/eval_images", records[0]["id"])   # [.../synthetic-0-7.png]

`vlrl.evaluation.evaluate` writes the records, `vlrl.evaluation.compare` pairs them, `vlrl.report` shows them; all three read them here.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from vlrl.base.errors import EvalError
from vlrl.model.prompts import row_images, row_video

MAX_IMAGE_SIDE = 768  # saved eval images are for people reading the report; larger ones are shrunk to this side


def read_records(path: str | Path) -> list[dict]:
    """Reads a JSONL file of records; a missing file holds none. A torn last line (a write cut off by an interrupt)
    is skipped.

    A broken line anywhere else is not an interrupt but a damaged file, and raises EvalError naming the line.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "eval.jsonl"
    >>> _ = path.write_text('{"id": "a", "correct": true}\\n{"id": "b", "corr')
    >>> [r["id"] for r in read_records(path)]
    ['a']
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # the interrupted write of the last batch; resume rewrites that item
            raise EvalError(f"{path}:{number} is not valid JSON ({line[:60]!r}...); only the last line of a record "
                            "file may be torn by an interrupt. Delete the damaged line to resume.") from None
    return records


def by_id(records: list[dict] | str | Path, name: str, required: tuple[str, ...], *, kind: str = "record",
          unit: str = "item", writer: str = "vlrl.evaluation.evaluate.evaluate") -> dict:
    """Records (a list or a JSONL path, then named by it) -> {id: record}, each checked for the `required` fields a
    comparison reads; `vlrl.evaluation.compare` (items) and `vlrl.evaluation.episode_compare` (episodes) both key their sides here.

    Raises:
        EvalError: a record without a required field, or an id that appears twice.

    >>> by_id([{"id": "a", "correct": True}], "before", ("id", "correct"))["a"]["correct"]
    True
    """
    if isinstance(records, (str, Path)):
        name, records = str(records), read_records(records)
    out = {}
    for index, record in enumerate(records):
        missing = [k for k in required if k not in record]
        if missing:
            raise EvalError(f"{kind} {index} of {name} has no {', '.join(missing)}; compare needs "
                            f"{', '.join(required)} in every {kind} ({writer} writes them).")
        if record["id"] in out:
            raise EvalError(f"{name} has {unit} {record['id']!r} twice; each {unit} must appear once per side.")
        out[record["id"]] = record
    return out


def drop_torn_tail(path: str | Path) -> None:
    """Truncates a torn last line, so the next append starts on a fresh line instead of gluing onto it.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "eval.jsonl"
    >>> _ = path.write_text('{"id": "a"}\\n{"id": "b", "corr')
    >>> drop_torn_tail(path); path.read_text()
    '{"id": "a"}\\n'
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def image_name(item_id) -> str:
    """The file name stem an item's image is saved under: the id itself when it is file-safe, else a safe form of
    it plus a short hash (so two ids never share a file).

    >>> image_name("synthetic-0-7"), image_name("mathvista/12")
    ('synthetic-0-7', 'mathvista_12-ac4b8021')
    """
    text = str(item_id)
    if re.fullmatch(r"[A-Za-z0-9_-]{1,100}", text):
        return text
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", text)[:80]
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def image_paths(image_dir: str | Path, item_id) -> list[Path]:
    """The saved images of one item, in prompt order: `<name>.png`, then `<name>.2.png`, ... for multi-image items."""
    image_dir, stem = Path(image_dir), image_name(item_id)
    first = image_dir / f"{stem}.png"
    if not first.exists():
        return []
    paths, k = [first], 2
    while (image_dir / f"{stem}.{k}.png").exists():
        paths.append(image_dir / f"{stem}.{k}.png")
        k += 1
    return paths


def save_images(row: dict, image_dir: str | Path) -> list[Path]:
    """Saves an item's images (PNG, longest side at most MAX_IMAGE_SIDE) unless already saved; returns their paths.

    The report shows flipped items from these files, so it works from the run directory alone: no data set to
    reload (a hub data set may be offline, a generator may change between versions).

    Args:
        row: a canonical or TRL row; its images may be PIL images or undecoded `{"bytes", "path"}` values.
        image_dir: the folder (a run's eval_images/).
    """
    image_dir = Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    stem = image_name(row["id"])
    paths = []
    pictures = row_images(row, decode=True)
    video = row_video(row)
    if not pictures and video:  # a clip: its kept frames side by side, one picture for the report
        from PIL import Image

        from vlrl.base.images import load_image

        frames = [load_image(frame) for frame in video[0]]
        strip = Image.new("RGB", (sum(f.width for f in frames), max(f.height for f in frames)), "white")
        for k, frame in enumerate(frames):
            strip.paste(frame, (sum(f.width for f in frames[:k]), 0))
        pictures = [strip]
    for k, image in enumerate(pictures, 1):
        path = image_dir / (f"{stem}.png" if k == 1 else f"{stem}.{k}.png")
        if not path.exists():
            image = image.copy()  # thumbnail shrinks in place, and an RGB image comes back as the row's own object
            image.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
            tmp = path.with_suffix(".tmp")
            image.save(tmp, format="PNG")
            tmp.replace(path)  # never a half-written PNG under the final name
        paths.append(path)
    return paths
