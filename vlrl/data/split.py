"""The hold-out split: train and eval rows disjoint by id and by picture, and the check that they stay so.

Nothing trains on an eval item: `split_holdout` drops (and counts) every training row that shares an id or a
picture with the held-out set; `drop_eval_overlap` does the same against a separate eval source (`[eval] source`),
and also drops a training row asking an eval item's question with its answer; `check_disjoint` refuses, with a
`DataError`, final datasets that overlap.
"""

from __future__ import annotations

import hashlib
import random
import re

from vlrl.base.errors import DataError
from vlrl.base.images import image_hash, undecoded
from vlrl.data.loaders import preprocess_workers
from vlrl.data.report import DataReport
from vlrl.model.prompts import row_images, row_video


def split_holdout(rows, n: int = 100, *, seed: int = 0, report: DataReport | None = None,
                  exclude_images: set[str] = frozenset()):
    """Splits rows into (train, held_out) with `n` held-out items, disjoint by id and by image content.

    Training rows whose id or picture also appears in the held-out set are dropped (and counted), so no eval item
    or eval picture is ever trained on.

    Args:
        rows: canonical rows, a list or a `datasets.Dataset` (the result has the same type).
        n: held-out items.
        seed: the shuffle seed.
        report: a DataReport to record the split in.
        exclude_images: picture hashes (`image_hash`) the model has already trained on (a warm start's): rows showing
            one are never held out, only trained on; counted as `eval_excluded_seen_image`.

    Returns:
        (train, held_out), of the type of `rows`.

    Raises:
        DataError: `n` is not smaller than the data set, or too few rows show a picture the model has not seen.

    >>> from vlrl import synthetic
    >>> train, held = split_holdout(synthetic.generate(20, image_size=32), n=5)
    >>> len(held), {r["id"] for r in train} & {r["id"] for r in held}
    (5, set())
    """
    if not 0 < n < len(rows):
        raise DataError(f"hold_out ({n}) must be at least 1 and smaller than the data set ({len(rows)} rows); "
                        "lower hold_out or load more items.")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    ids = _ids(rows)
    hashes = picture_hashes(rows)  # one pass: each picture decoded once
    seen = [i for i in order if hashes[i] & exclude_images]
    held_idx = [i for i in order if not hashes[i] & exclude_images][:n]
    if len(held_idx) < n:
        raise DataError(f"hold_out ({n}) needs {n} rows whose pictures the model has not trained on, and only "
                        f"{len(held_idx)} of {len(rows)} are ({len(seen)} show a warm-start picture); load more "
                        "items or lower hold_out.")
    held = set(held_idx)
    order = held_idx + [i for i in order if i not in held]
    held_ids = {ids[i] for i in held_idx}
    held_images = set().union(*(hashes[i] for i in held_idx))
    train_idx, same_id, same_image = [], 0, 0
    for i in order[n:]:
        if ids[i] in held_ids:
            same_id += 1
        elif hashes[i] & held_images:
            same_image += 1
        else:
            train_idx.append(i)
    if report is not None:
        report.hold_out = {"n": n, "seed": seed, "train": len(train_idx), "eval": n,
                           "train_dropped_same_id": same_id, "train_dropped_same_image": same_image,
                           "eval_excluded_seen_image": len(seen)}
    if isinstance(rows, list):
        return [rows[i] for i in train_idx], [rows[i] for i in held_idx]
    return rows.select(train_idx), rows.select(held_idx)


def drop_eval_overlap(train_rows, eval_rows, *, report: DataReport | None = None):
    """The training rows that share no id, no picture (`image_hash`) and no question-with-answer (`qa_key`) with
    `eval_rows`, an eval set from another source; the rest are dropped and counted.

    Returns:
        The kept training rows, of the type of `train_rows`.

    Raises:
        DataError: every training row overlaps the eval set.

    >>> from vlrl import synthetic
    >>> items = synthetic.generate(6, image_size=32)
    >>> copy = dict(items[0], id="elsewhere-7")  # the same item under another source's id
    >>> len(drop_eval_overlap(items[1:] + [copy], items[:2]))
    4
    """
    eval_ids, eval_images, eval_qa = set(_ids(eval_rows)), set(), set()
    for row in eval_rows:
        eval_images |= _row_hashes(row)
        eval_qa.add(qa_key(row))
    eval_qa = {key for key in eval_qa if key[0]}  # a question of no letters matches nothing
    counts = {"train_dropped_same_id": 0, "train_dropped_same_image": 0, "train_dropped_same_question": 0}
    keep = []
    train_qa = _qa_keys(train_rows)
    train_images = picture_hashes(train_rows)
    for i, item_id in enumerate(_ids(train_rows)):
        reason = ("train_dropped_same_id" if item_id in eval_ids else
                  "train_dropped_same_question" if train_qa[i] in eval_qa else
                  "train_dropped_same_image" if train_images[i] & eval_images else None)
        if reason:
            counts[reason] += 1
        else:
            keep.append(i)
    if report is not None:
        report.eval_source["overlap"] = {"train": len(keep), "eval": len(eval_rows), **counts}
    if not keep:
        raise DataError(f"all {len(train_rows)} training items overlap the eval set ({counts}); train on another "
                        "source than the one [eval] source names.")
    if isinstance(train_rows, list):
        return [train_rows[i] for i in keep]
    return train_rows if len(keep) == len(train_rows) else train_rows.select(keep)


def qa_key(row: dict) -> tuple[str, str]:
    """A row's question and answer, lower case, with only letters and digits: the same item re-typeset matches.

    >>> qa_key({"question": "<image>Find  x.", "answer": "3"}) == qa_key({"question": "find x", "answer": " 3"})
    True
    """
    return _letters_and_digits(row.get("question")), _letters_and_digits(row.get("answer"))


def _letters_and_digits(text) -> str:
    return re.sub(r"[\W_]+", "", str(text or "").replace("<image>", "").lower())


def check_disjoint(train_rows, eval_rows) -> None:
    """Refuses to train on eval items: raises DataError naming the overlapping ids or pictures.

    >>> check_disjoint([{"id": "a"}], [{"id": "a"}])
    Traceback (most recent call last):
    ...
    vlrl.base.errors.DataError: 1 training items are in the eval set (e.g. ['a']); ...
    """
    overlap = set(_ids(train_rows)) & set(_ids(eval_rows))
    if overlap:
        raise DataError(f"{len(overlap)} training items are in the eval set (e.g. {sorted(overlap)[:3]}); "
                        "split with vlrl.data.split_holdout and train on its first part only.")
    eval_images = {}
    for row in eval_rows:
        for h in _row_hashes(row):
            eval_images.setdefault(h, row["id"])
    shared = [(item_id, eval_images[h]) for item_id, hashes in zip(_ids(train_rows), picture_hashes(train_rows))
              for h in hashes if h in eval_images]
    if shared:
        raise DataError(f"{len(shared)} training items show a picture of the eval set (e.g. train {shared[0][0]!r} = "
                        f"eval {shared[0][1]!r}); split with vlrl.data.split_holdout, which drops them from training.")


def picture_hashes(rows) -> list[set[str]]:
    """Each row's picture hashes (`image_hash`), in row order.

    Hashing decodes every picture: ~3 ms a row on one core, so the 38,870 rows of ViRL39K took about 2 minutes a pass.
    A large `datasets.Dataset` is hashed in worker processes (`preprocess_workers`), and datasets caches the result
    beside a dataset read from its cache files, so a later run of the same data hashes nothing.

    >>> from vlrl import synthetic
    >>> items = synthetic.generate(2, image_size=32)
    >>> [len(h) for h in picture_hashes(items)], picture_hashes(items[:1]) == picture_hashes([dict(items[0], id="x")])
    ([1, 1], True)
    """
    workers = preprocess_workers(len(rows)) if hasattr(rows, "column_names") else None
    if not workers:
        return [_row_hashes(row) for row in rows]
    hashed = undecoded(rows).map(_hash_row, remove_columns=rows.column_names, num_proc=workers if workers > 1 else None,
                                 desc="hashing pictures")
    return [set(h) for h in hashed["hashes"]]


def _hash_row(row: dict) -> dict:
    return {"hashes": sorted(_row_hashes(row))}


def _row_hashes(row: dict) -> set[str]:
    """The row's pictures' hashes, and its clip's (one hash of its frames' in order: two clips sharing a frame are
    not the same clip)."""
    hashes = {image_hash(image) for image in row_images(row)}
    video = row_video(row)
    if video:
        hashes.add(hashlib.sha256("".join(image_hash(frame) for frame in video[0]).encode()).hexdigest())
    return hashes


def _qa_keys(rows) -> list[tuple[str, str]]:
    """`qa_key` of each row, reading only the question and answer columns of a Dataset (no picture decoded)."""
    if hasattr(rows, "column_names"):
        columns = rows.select_columns([c for c in ("question", "answer") if c in rows.column_names])
        return [qa_key(row) for row in columns]
    return [qa_key(row) for row in rows]


def _ids(rows) -> list:
    return list(rows["id"]) if hasattr(rows, "column_names") else [r["id"] for r in rows]  # no image decoding
