"""Evaluation: batched generation -> one JSON record per item (appended as it goes, resumable), and `compare()`,
the paired before/after statistics that say whether a change is real.

    records = evaluate(model, processor, eval_ds, "runs/demo/eval_before.jsonl", batch_size=16)
    comparison = compare("runs/demo/eval_before.jsonl", "runs/demo/eval_after.jsonl")

Correctness comes from `vlrl.answers` and the reward parts from `vlrl.rewards`, so eval and reward always agree.
A record is one line of JSON:

    {id, question, gold, completion, prediction, correct, match, format_ok, format_reward, correctness_reward,
     reward, degeneration_ratio, degenerate, prompt_tokens, completion_tokens, finish_reason, max_new_tokens,
     do_sample, temperature, metadata?}
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from pathlib import Path

from vlrl import answers, rewards

# Metadata keys the comparison breaks accuracy down by (MathVista's and the synthetic generator's); a list value
# (MathVista's `skills`) puts the item in every group it names.
BREAKDOWN_KEYS = ("skills", "task", "context", "grade", "category", "source", "difficulty")
MAX_IMAGE_SIDE = 768  # saved eval images are for people reading the report; larger ones are shrunk to this side


# --- records on disk ---------------------------------------------------------------------------------------------

def read_records(path: str | Path) -> list[dict]:
    """Reads a JSONL file of records. A torn last line (a write cut off by an interrupt) is skipped.

    A broken line anywhere else is not an interrupt but a damaged file, and raises ValueError naming the line.

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
            raise ValueError(f"{path}:{number} is not valid JSON ({line[:60]!r}...); only the last line of a record "
                             "file may be torn by an interrupt. Delete the damaged line to resume.") from None
    return records


def _drop_torn_tail(path: Path) -> None:
    """Truncates a torn last line, so the next append starts on a fresh line instead of gluing onto it."""
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


def row_images(row: dict) -> list:
    """The images of a TRL row, in prompt order (`images` for multi-image rows, else `[image]`, else none)."""
    if row.get("images"):
        return [_as_pil(i) for i in row["images"]]
    return [_as_pil(row["image"])] if row.get("image") is not None else []


def _as_pil(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if isinstance(image, dict):  # an undecoded `datasets` image: {"bytes": ..., "path": ...}
        image = image.get("bytes") or image.get("path")
    if isinstance(image, (bytes, bytearray)):
        return Image.open(io.BytesIO(image))
    return Image.open(image)


def save_images(row: dict, image_dir: str | Path) -> list[Path]:
    """Saves an item's images (PNG, longest side at most MAX_IMAGE_SIDE) unless already saved; returns their paths.

    The report shows flipped items from these files, so it works from the run directory alone: no data set to
    reload (a hub data set may be offline, a generator may change between versions).
    """
    image_dir = Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    stem = image_name(row["id"])
    paths = []
    for k, image in enumerate(row_images(row), 1):
        path = image_dir / (f"{stem}.png" if k == 1 else f"{stem}.{k}.png")
        if not path.exists():
            image = image.convert("RGB")
            image.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
            tmp = path.with_suffix(".tmp")
            image.save(tmp, format="PNG")
            tmp.replace(path)  # never a half-written PNG under the final name
        paths.append(path)
    return paths


# --- scoring -----------------------------------------------------------------------------------------------------

def score(completion: str, row: dict) -> dict:
    """The record fields that come from scoring one completion against its row (the same parts the rewards use).

    >>> r = score("<REASONING>3+4</REASONING><SOLUTION>7</SOLUTION>", {"answer": "7"})
    >>> r["correct"], r["format_ok"], r["reward"]
    (True, True, 2.6)
    """
    meta = {k: row.get(k) for k in rewards.META_COLUMNS}  # the columns the reward reads, so both agree
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
        "degenerate": fmt["degenerate"],
    }


def question(row: dict) -> str:
    """The text of the prompt's last turn (the question as the model saw it), or the row's `question`."""
    return answers.as_text(row["prompt"][-1]["content"]) if row.get("prompt") else str(row.get("question", ""))


# --- generation --------------------------------------------------------------------------------------------------

def evaluate(model, processor, dataset, output_path: str | Path, *, batch_size: int = 8, max_new_tokens: int = 1024,
             do_sample: bool = False, temperature: float = 1.0, image_dir: str | Path | None = None,
             progress: bool = True, log=None) -> list[dict]:
    """Generates for every row of `dataset` (TRL prompt rows) and appends one record per item to `output_path`.

    Items whose id is already in `output_path` are skipped, so an interrupted eval resumes where it stopped. Each
    batch's records are written in one append and flushed, so an interrupt tears at most the last line, which
    `read_records` skips and the next call regenerates.

    Args:
        model: the model (PEFT-wrapped or not).
        processor: its processor (left padding is set here: generation continues from the right end).
        dataset: rows with `id`, `prompt`, `image` (or `images`), `answer`, the MathVista scoring columns, and
            optionally `metadata` (kept in the records, for the comparison's breakdown).
        output_path: the JSONL file of records.
        batch_size: prompts per generate call.
        max_new_tokens: completion budget; a completion that hits it has finish_reason "length".
        do_sample: greedy (False, the default: the same model gives the same records) or sampled decoding.
        temperature: sampling temperature (used only with do_sample).
        image_dir: when given, each item's images are saved there (see `save_images`) for the report.
        progress: show a progress bar.
        log: optional callable for a one-line summary (items, seconds, items/s, accuracy).

    Returns:
        All records in the file for the dataset's ids, in dataset order.
    """
    import time

    from tqdm.auto import tqdm

    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    ids = [row["id"] for row in dataset]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:3]
        raise ValueError(f"the eval set has duplicate ids (e.g. {dupes}); records are keyed by id, so each item "
                         "needs its own. Deduplicate the rows before evaluating.")
    settings = {"max_new_tokens": max_new_tokens, "do_sample": do_sample,
                "temperature": temperature if do_sample else None}
    _drop_torn_tail(output_path)
    existing = read_records(output_path)
    _check_settings(existing, settings, output_path)
    done = {r["id"] for r in existing}
    todo = [row for row in dataset if row["id"] not in done]

    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"  # batched generation appends on the right: prompts must end at the same column
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos |= set(configured if isinstance(configured, list) else [configured])
    eos = sorted(t for t in eos if isinstance(t, int) and t >= 0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    started = time.time()
    bar = tqdm(total=len(todo), desc=f"eval {output_path.name}", unit="item", disable=not progress)
    try:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            lines = [json.dumps(r) + "\n" for r in _generate_batch(model, processor, batch, device, eos, pad, settings)]
            if image_dir is not None:
                for row in batch:
                    save_images(row, image_dir)
            with output_path.open("a") as f:
                f.write("".join(lines))
                f.flush()
            bar.update(len(batch))
    finally:
        bar.close()
        model.train(was_training)
    by_id = {r["id"]: r for r in read_records(output_path)}
    records = [by_id[i] for i in ids if i in by_id]
    if log is not None and records:
        seconds = time.time() - started
        accuracy = sum(r["correct"] for r in records) / len(records)
        log(f"eval: {len(todo)} items generated ({len(ids) - len(todo)} resumed from {output_path.name}) in "
            f"{seconds:.1f} s ({len(todo) / max(seconds, 1e-9):.2f} items/s); accuracy {accuracy:.1%}")
    return records


def _generate_batch(model, processor, batch, device, eos, pad, settings) -> list[dict]:
    import torch

    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in batch]
    images = [image for r in batch for image in row_images(r)]  # in prompt order: the processor pairs them in turn
    inputs = processor(text=texts, images=images or None, return_tensors="pt", padding=True).to(device)
    sampling = {"temperature": settings["temperature"]} if settings["do_sample"] else {}
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=settings["max_new_tokens"], do_sample=settings["do_sample"],
                             top_p=None, top_k=None, eos_token_id=eos, pad_token_id=pad, **sampling)
    new_tokens = out[:, inputs["input_ids"].shape[1]:].tolist()
    prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
    records = []
    for row, tokens, n_prompt in zip(batch, new_tokens, prompt_tokens):
        ended = next((i for i, t in enumerate(tokens) if t in eos), None)
        kept = tokens[:ended] if ended is not None else tokens
        completion = processor.tokenizer.decode(kept, skip_special_tokens=True)
        record = {"id": row["id"], "question": question(row), "gold": row.get("answer"), "completion": completion,
                  **score(completion, row), "prompt_tokens": int(n_prompt), "completion_tokens": len(kept),
                  "finish_reason": "stop" if ended is not None else "length", **settings}
        if isinstance(row.get("metadata"), dict):
            record["metadata"] = _jsonable_metadata(row["metadata"])
        records.append(record)
    return records


def _jsonable_metadata(metadata: dict) -> dict:
    # Worked reasoning (the synthetic warm-start target) is an answer key, not a property of the item: left out.
    return {k: v for k, v in metadata.items() if k != "reasoning" and _is_jsonable(v)}


def _is_jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _check_settings(existing: list[dict], settings: dict, path: Path) -> None:
    """Resuming with other decoding settings would mix two evals in one file: refused, with the fix."""
    for record in existing:
        old = {k: record.get(k) for k in settings}
        if any(k in record for k in settings) and old != settings:
            raise ValueError(f"{path} holds records generated with {old}, and this eval asks for {settings}; "
                             "resume with the same settings, or write to a new file.")


# --- statistics --------------------------------------------------------------------------------------------------

def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% by default): honest near 0% and 100%, unlike p +- 1.96 SE.

    >>> [round(x, 4) for x in wilson(5, 100)]
    [0.0215, 0.1118]
    >>> [round(x, 4) for x in wilson(0, 10)]
    [0.0, 0.2775]
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

    Under "no change" each flip goes either way with probability 1/2, so min(b, c) ~ Binomial(b + c, 1/2);
    items that stay right or stay wrong carry no information about the change.

    >>> round(mcnemar_exact(10, 2), 4)
    0.0386
    >>> mcnemar_exact(3, 2)
    1.0
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _load(records, name: str) -> dict:
    """Records (a list or a JSONL path) -> {id: record}, checking the three fields compare needs."""
    if isinstance(records, (str, Path)):
        name, records = str(records), read_records(records)
    by_id = {}
    for index, record in enumerate(records):
        missing = [k for k in ("id", "correct", "format_ok") if k not in record]
        if missing:
            raise ValueError(f"record {index} of {name} has no {', '.join(missing)}; compare needs id, correct and "
                             "format_ok in every record (vlrl.evaluate.evaluate writes them).")
        if record["id"] in by_id:
            raise ValueError(f"{name} has id {record['id']!r} twice; each item must appear once per side.")
        by_id[record["id"]] = record
    return by_id


def _paired_stats(before: list[dict], after: list[dict]) -> dict:
    """Accuracy before/after, the 2x2 table, its McNemar p, and the flips, for records paired by position."""
    flips = {"wrong_to_right": [], "right_to_wrong": []}
    both_right = both_wrong = 0
    for b, a in zip(before, after):
        if b["correct"] and a["correct"]:
            both_right += 1
        elif not b["correct"] and not a["correct"]:
            both_wrong += 1
        else:
            flips["wrong_to_right" if a["correct"] else "right_to_wrong"].append(b["id"])
    n = len(before)
    return {"n": n,
            "accuracy_before": sum(bool(r["correct"]) for r in before) / n if n else None,
            "accuracy_after": sum(bool(r["correct"]) for r in after) / n if n else None,
            "table": {"both_right": both_right, "wrong_to_right": len(flips["wrong_to_right"]),
                      "right_to_wrong": len(flips["right_to_wrong"]), "both_wrong": both_wrong},
            "mcnemar_p": mcnemar_exact(len(flips["wrong_to_right"]), len(flips["right_to_wrong"])),
            **flips}


def _groups(records: list[dict], key: str) -> dict[str, list[int]]:
    """Metadata value -> positions of the records that have it (a list value counts for each of its elements)."""
    groups: dict[str, list[int]] = {}
    for position, record in enumerate(records):
        value = (record.get("metadata") or {}).get(key)
        values = value if isinstance(value, list) else [value]
        for v in values or [None]:
            groups.setdefault("(missing)" if v is None else str(v), []).append(position)
    return groups


def breakdown(before: list[dict], after: list[dict], keys=BREAKDOWN_KEYS) -> dict:
    """Paired accuracy per metadata group (MathVista's skills, context, grade...), for the keys that split the items
    into at least two groups.

    >>> rec = lambda i, ok, skill: {"id": i, "correct": ok, "format_ok": True, "metadata": {"skills": [skill]}}
    >>> out = breakdown([rec(1, False, "geometry"), rec(2, True, "counting")],
    ...                 [rec(1, True, "geometry"), rec(2, True, "counting")])
    >>> out["skills"]["geometry"]["wrong_to_right"], out["skills"]["counting"]["accuracy_before"]
    (1, 1.0)
    """
    result = {}
    for key in keys:
        if not any(key in (r.get("metadata") or {}) for r in before + after):
            continue
        groups = _groups(before, key)
        if len(groups) < 2:
            continue  # one group repeats the overall numbers
        result[key] = {}
        for value, positions in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            stats = _paired_stats([before[p] for p in positions], [after[p] for p in positions])
            for flip in ("wrong_to_right", "right_to_wrong"):
                stats[flip] = len(stats[flip])  # counts here; the ids are in the overall flip lists
            del stats["table"]
            result[key][value] = stats
    return result


def compare(before: list[dict] | str | Path, after: list[dict] | str | Path) -> dict:
    """Before/after statistics on per-item records, paired by id. The fields used are `id`, `correct`, `format_ok`
    (and, when present, the reward parts, `completion_tokens`, `finish_reason`, `degenerate` and `metadata`).

    Args:
        before: records (or a JSONL path) of the model before training.
        after: records (or a JSONL path) of the model after training.

    Returns:
        A JSON-ready dict: `n_before`, `n_after`, `n_paired`, `only_before` / `only_after` (ids evaluated on one
        side only: reported, and left out of the paired statistics); per side `accuracy_*` and `format_*` with
        `*_ci95` (Wilson); `table` (the paired 2x2 counts), `mcnemar_p` (exact, two-sided, on correctness),
        `wrong_to_right` / `right_to_wrong` (ids); `format_mcnemar_p`, `format_gained` / `format_lost`; means of
        the reward parts and completion length, degenerate and truncated shares; `breakdown` by metadata.

    >>> rec = lambda i, ok: {"id": i, "correct": ok, "format_ok": True}
    >>> before = [rec(i, False) for i in range(12)] + [rec(12, True), rec(13, True)]
    >>> after = [rec(i, i < 10) for i in range(12)] + [rec(12, False), rec(13, False)]
    >>> c = compare(before, after)
    >>> c["table"], round(c["mcnemar_p"], 4)
    ({'both_right': 0, 'wrong_to_right': 10, 'right_to_wrong': 2, 'both_wrong': 2}, 0.0386)
    """
    b_by, a_by = _load(before, "before"), _load(after, "after")
    paired = [i for i in b_by if i in a_by]
    b_rows, a_rows = [b_by[i] for i in paired], [a_by[i] for i in paired]
    stats = _paired_stats(b_rows, a_rows)
    result = {"n_before": len(b_by), "n_after": len(a_by), "n_paired": len(paired),
              "only_before": [i for i in b_by if i not in a_by], "only_after": [i for i in a_by if i not in b_by]}
    for side, rows in (("before", b_rows), ("after", a_rows)):
        for metric, key in (("accuracy", "correct"), ("format", "format_ok")):
            k = sum(bool(r[key]) for r in rows)
            result[f"{metric}_{side}"] = k / len(rows) if rows else None
            result[f"{metric}_{side}_ci95"] = list(wilson(k, len(rows)))
    for metric in ("accuracy", "format"):
        result[f"{metric}_delta"] = result[f"{metric}_after"] - result[f"{metric}_before"] if paired else None
    result.update(table=stats["table"], mcnemar_p=stats["mcnemar_p"], wrong_to_right=stats["wrong_to_right"],
                  right_to_wrong=stats["right_to_wrong"])
    format_gained = [i for i in paired if not b_by[i]["format_ok"] and a_by[i]["format_ok"]]
    format_lost = [i for i in paired if b_by[i]["format_ok"] and not a_by[i]["format_ok"]]
    result.update(format_mcnemar_p=mcnemar_exact(len(format_gained), len(format_lost)),
                  format_gained=format_gained, format_lost=format_lost)
    for side, rows in (("before", b_rows), ("after", a_rows)):
        for key in ("reward", "format_reward", "correctness_reward", "completion_tokens"):
            values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]
            result[f"{key}_mean_{side}"] = sum(values) / len(values) if values else None
        flags = {"degenerate": [r["degenerate"] for r in rows if "degenerate" in r],
                 "truncated": [r["finish_reason"] == "length" for r in rows if "finish_reason" in r]}
        for name, values in flags.items():
            result[f"{name}_rate_{side}"] = sum(values) / len(values) if values else None
    result["breakdown"] = breakdown(b_rows, a_rows)
    return result


def summary(comparison: dict, alpha: float = 0.05) -> str:
    """A few lines a person can read: the two rates with their intervals, the paired test and what it means.

    >>> rec = lambda i, ok: {"id": i, "correct": ok, "format_ok": True}
    >>> print(summary(compare([rec(i, i < 5) for i in range(100)], [rec(i, i < 6) for i in range(100)])))
    accuracy 5.0% [2.2%, 11.2%] -> 6.0% [2.8%, 12.5%] on 100 paired items (1 wrong->right, 0 right->wrong)
    format   100.0% [96.3%, 100.0%] -> 100.0% [96.3%, 100.0%] (0 gained, 0 lost)
    McNemar exact p = 1 for accuracy: not distinguishable from noise at 0.05; format p = 1
    """
    c = comparison

    def rate(metric, side):
        low, high = c[f"{metric}_{side}_ci95"]
        return "n/a" if c[f"{metric}_{side}"] is None else f"{c[f'{metric}_{side}']:.1%} [{low:.1%}, {high:.1%}]"

    verdict = ("a real change" if c["mcnemar_p"] < alpha else "not distinguishable from noise") + f" at {alpha:g}"
    lines = [
        (f"accuracy {rate('accuracy', 'before')} -> {rate('accuracy', 'after')} on {c['n_paired']} paired items "
         f"({len(c['wrong_to_right'])} wrong->right, {len(c['right_to_wrong'])} right->wrong)"),
        (f"format   {rate('format', 'before')} -> {rate('format', 'after')} "
         f"({len(c['format_gained'])} gained, {len(c['format_lost'])} lost)"),
        f"McNemar exact p = {c['mcnemar_p']:.3g} for accuracy: {verdict}; format p = {c['format_mcnemar_p']:.3g}",
    ]
    if c["only_before"] or c["only_after"]:
        lines.append(f"unpaired: {len(c['only_before'])} items only before, {len(c['only_after'])} only after "
                     "(left out of the paired statistics)")
    return "\n".join(lines)
