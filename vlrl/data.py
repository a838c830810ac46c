"""Data: canonical rows, prompt building, the length filter and the held-out split.

Every loader returns rows in one canonical schema:
`{id, question, image, answer, answer_type, precision, question_type, choices, unit, metadata}`.
`to_prompt()` turns a row into TRL's conversational form (`prompt` + `image` + the scoring columns), which
GRPOTrainer passes on to the reward functions as keyword arguments.
"""

from __future__ import annotations

import hashlib
import io

INSTRUCTION = (
    "Reason about the image inside <REASONING>...</REASONING>, then give only the final answer inside "
    "<SOLUTION>...</SOLUTION>."
)
SCORING_COLUMNS = ("answer", "precision", "question_type", "choices", "unit", "answer_type")


def question_text(row: dict) -> str:
    """The question as the model sees it: the question, its choices when it has them, and the answer instruction.

    >>> question_text({"question": "Which is larger?", "choices": ["3", "7"]})
    'Which is larger?\\nChoices: (A) 3 (B) 7\\nReason about ...'
    """
    text = str(row["question"]).strip()
    if row.get("choices"):
        options = " ".join(f"({chr(ord('A') + i)}) {c}" for i, c in enumerate(row["choices"]))
        text += f"\nChoices: {options}"
    return f"{text}\n{INSTRUCTION}"


def to_prompt(row: dict) -> dict:
    """A canonical row -> TRL conversational row: `prompt` (one user turn: image, then text), `image`, scoring columns."""
    return {
        "id": row["id"],
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question_text(row)}]}],
        "image": row["image"],
        **{k: row.get(k) for k in SCORING_COLUMNS},
    }


def to_dataset(rows: list[dict]):
    """Canonical rows -> a `datasets.Dataset` of TRL prompt rows."""
    import datasets

    return datasets.Dataset.from_list([to_prompt(r) for r in rows])


def prompt_tokens(processor, row: dict) -> int:
    """The prompt's length in tokens as the model sees it, image tokens included (the processor expands them)."""
    text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[row["image"]], return_tensors="pt")
    return int(inputs["input_ids"].shape[1])


def filter_by_length(dataset, processor, max_prompt_tokens: int):
    """Drops prompts longer than `max_prompt_tokens` (never truncates through image tokens). Returns (kept, dropped)."""
    keep = [i for i, row in enumerate(dataset) if prompt_tokens(processor, row) <= max_prompt_tokens]
    return dataset.select(keep), len(dataset) - len(keep)


def image_hash(image) -> str:
    """A content hash of an image's pixels, so the same picture under two ids is still recognized."""
    data = image.convert("RGB").tobytes() if hasattr(image, "tobytes") else io.BytesIO(image).getvalue()
    return hashlib.sha256(data).hexdigest()[:16]


def split_holdout(rows: list[dict], n: int, *, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Splits rows into (train, held_out) with `n` held-out items, disjoint by id and by image content.

    Training rows whose image also appears in the held-out set are dropped, so no eval picture is trained on.
    """
    import random

    if n >= len(rows):
        raise ValueError(f"hold_out ({n}) must be smaller than the data set ({len(rows)} rows)")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = [rows[i] for i in order[:n]]
    held_ids, held_images = {r["id"] for r in held}, {image_hash(r["image"]) for r in held}
    train = [rows[i] for i in order[n:]
             if rows[i]["id"] not in held_ids and image_hash(rows[i]["image"]) not in held_images]
    return train, held


def check_disjoint(train_rows, eval_rows) -> None:
    """Refuses to train on eval items: raises ValueError naming the overlapping ids."""
    overlap = {r["id"] for r in train_rows} & {r["id"] for r in eval_rows}
    if overlap:
        raise ValueError(f"{len(overlap)} training items are in the eval set (e.g. {sorted(overlap)[:3]}); "
                         "split with vlrl.data.split_holdout and train on its first part only.")
