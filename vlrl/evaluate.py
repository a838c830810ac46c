"""Evaluation: batched generation -> one JSON record per item (written as it goes, resumable), and `compare()`.

Correctness comes from `vlrl.answers` and the reward parts from `vlrl.rewards`, so eval and reward always agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from vlrl import answers, rewards

META_FIELDS = ("precision", "question_type", "choices", "unit")


def read_records(path: str | Path) -> list[dict]:
    """Reads a JSONL file of records; a torn last line (an interrupted write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def score(completion: str, row: dict) -> dict:
    """The record fields that come from scoring one completion against its row."""
    meta = {k: row.get(k) for k in META_FIELDS}
    fmt = rewards.format_parts(completion)
    corr = rewards.correctness_parts(completion, row.get("answer"), **meta)
    return {
        "prediction": corr["prediction"],
        "correct": corr["match"] != "none",
        "match": corr["match"],
        "format_ok": fmt["reasoning_blocks"] == 1 and fmt["solution_blocks"] == 1 and not fmt["degenerate"],
        "format_reward": fmt["score"],
        "correctness_reward": corr["score"],
        "reward": rewards.total_reward(fmt["score"], corr["score"]),
        "degeneration_ratio": fmt["degeneration_ratio"],
    }


def evaluate(model, processor, dataset, output_path: str | Path, *, batch_size: int = 8, max_new_tokens: int = 1024,
             do_sample: bool = False, temperature: float = 1.0, progress: bool = True) -> list[dict]:
    """Generates for every row of `dataset` (TRL prompt rows) and appends one record per item to `output_path`.

    Items whose id is already in `output_path` are skipped, so an interrupted eval resumes where it stopped.

    Args:
        model: the model (PEFT-wrapped or not).
        processor: its processor (left padding is set here).
        dataset: rows with `id`, `prompt`, `image`, `answer` and the MathVista scoring columns.
        output_path: the JSONL file of records.
        batch_size: prompts per generate call.
        max_new_tokens: completion budget; a completion that hits it has finish_reason "length".
        do_sample: greedy (False, the default) or sampled decoding.

    Returns:
        All records in the file, in dataset order.
    """
    import torch
    from tqdm.auto import tqdm

    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    done = {r["id"] for r in read_records(output_path)}
    todo = [row for row in dataset if row["id"] not in done]
    processor.tokenizer.padding_side = "left"
    eos = {processor.tokenizer.convert_tokens_to_ids("<|im_end|>"), processor.tokenizer.eos_token_id,
           processor.tokenizer.pad_token_id}
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(todo), desc="eval", unit="item", disable=not progress)
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in batch]
        inputs = processor(text=texts, images=[r["image"] for r in batch], return_tensors="pt", padding=True)
        inputs = inputs.to(device)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                 temperature=temperature if do_sample else None, top_p=None, top_k=None,
                                 pad_token_id=processor.tokenizer.pad_token_id)
        new_tokens = out[:, inputs["input_ids"].shape[1]:].tolist()
        with output_path.open("a") as f:
            for row, tokens in zip(batch, new_tokens):
                ended = next((i for i, t in enumerate(tokens) if t in eos), None)
                kept = tokens[:ended] if ended is not None else tokens
                completion = processor.tokenizer.decode(kept, skip_special_tokens=True)
                record = {
                    "id": row["id"], "question": _question(row), "gold": row.get("answer"),
                    "completion": completion, **score(completion, row),
                    "completion_tokens": len(kept), "finish_reason": "stop" if ended is not None else "length",
                }
                f.write(json.dumps(record) + "\n")
        bar.update(len(batch))
    bar.close()
    model.train(was_training)
    by_id = {r["id"]: r for r in read_records(output_path)}
    return [by_id[row["id"]] for row in dataset if row["id"] in by_id]


def _question(row: dict) -> str:
    text = answers.as_text(row["prompt"][-1]["content"]) if row.get("prompt") else row.get("question", "")
    return text


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval for a proportion.

    >>> [round(x, 4) for x in wilson(5, 100)]
    [0.0215, 0.1118]
    """
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, center - half), min(1.0, center + half))


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts b (wrong->right) and c (right->wrong).

    >>> round(mcnemar_exact(10, 2), 4)
    0.0386
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def compare(before: list[dict] | str | Path, after: list[dict] | str | Path) -> dict:
    """Before/after statistics on per-item records (fields used: id, correct, format_ok, reward parts)."""
    before = read_records(before) if isinstance(before, (str, Path)) else before
    after = read_records(after) if isinstance(after, (str, Path)) else after
    b_by, a_by = {r["id"]: r for r in before}, {r["id"]: r for r in after}
    paired = [i for i in b_by if i in a_by]
    result = {"n_paired": len(paired), "only_before": sorted(set(b_by) - set(a_by)),
              "only_after": sorted(set(a_by) - set(b_by))}
    for side, by in (("before", b_by), ("after", a_by)):
        rows = [by[i] for i in paired]
        for metric, key in (("accuracy", "correct"), ("format", "format_ok")):
            k = sum(bool(r.get(key)) for r in rows)
            low, high = wilson(k, len(rows))
            result[f"{metric}_{side}"] = k / len(rows) if rows else 0.0
            result[f"{metric}_{side}_ci95"] = [low, high]
        for key in ("reward", "format_reward", "correctness_reward"):
            values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
            result[f"{key}_mean_{side}"] = sum(values) / len(values) if values else None
    wrong_to_right = [i for i in paired if not b_by[i].get("correct") and a_by[i].get("correct")]
    right_to_wrong = [i for i in paired if b_by[i].get("correct") and not a_by[i].get("correct")]
    result.update(wrong_to_right=wrong_to_right, right_to_wrong=right_to_wrong,
                  mcnemar_p=mcnemar_exact(len(wrong_to_right), len(right_to_wrong)))
    return result
