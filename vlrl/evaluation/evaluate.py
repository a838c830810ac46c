"""Evaluation: batched generation -> one JSON record per item, appended as it goes (an interrupted eval resumes),
each scored by the code the rewards use, so eval and reward always agree.

    records = evaluate(model, processor, eval_ds, "runs/demo/eval_before.jsonl", batch_size=16)

A record is one line of JSON. It carries the item's scoring columns, so it can be scored again on its own
(`rescore`, and the browser reward calculator):

    {id, question, gold, precision, question_type, choices, unit, answer_type, completion, prediction, correct,
     match, format_ok, format_reward, correctness_reward, reward, degeneration_ratio, degenerate, prompt_tokens,
     completion_tokens, finish_reason, max_new_tokens, do_sample, temperature, samples, seed, thinking_budget,
     decoder, thinking_tokens?, thinking_closed?, thinking_cut?, metadata?}

With a thinking model (Qwen3-VL "-Thinking"), `completion` is the assistant's whole turn: when the chat template opens
`<think>` in the prompt, that opening comes first, so a completion cut inside its thinking scores as no answer. The
`thinking_*` fields (`vlrl.grammar.thinking.thinking_of`) are there when the completion has a thinking block: its tokens,
whether `</think>` was written, and whether `thinking_budget` cut it.

With `samples=K` (`vlrl eval --samples K`, `[eval] samples`) each item is sampled K times at the temperature, seeded,
and its record also holds `draws`: the K completions with their scores (the top-level fields are the first draw's, so
every reader of greedy records reads a sampled file as one draw per item) and `num_correct`. `vlrl.evaluation.passk` turns such
records into pass@k.

Reading record files and saving their images is `vlrl.evaluation.records`; comparing two evals is `vlrl.evaluation.compare`.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlrl import engine
from vlrl.base.errors import EvalError
from vlrl.evaluation.records import drop_torn_tail, read_records, save_images
from vlrl.grammar import answers, rewards, thinking
from vlrl.model import prompts
from vlrl.model.prompts import row_images

# --- scoring -----------------------------------------------------------------------------------------------------

def score(completion: str, row: dict, *, symbolic: bool = False) -> dict:
    """The record fields that come from scoring one completion against its row (the same parts the rewards use;
    `symbolic` as the run's `[training] reward = "symbolic"`, so eval and reward agree on geo3k-style answers).

    >>> r = score("<REASONING>3+4</REASONING><SOLUTION>7</SOLUTION>", {"answer": "7"})
    >>> r["correct"], r["format_ok"], r["reward"]
    (True, True, 2.6)
    """
    meta = {k: row.get(k) for k in rewards.META_COLUMNS}  # the columns the reward reads, so both agree
    fmt = rewards.format_parts(completion)
    corr = rewards.correctness_parts(completion, row.get("answer"), symbolic=symbolic, **meta)
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
    """The text of the prompt's last turn (the question as the model saw it), or the row's `question`. With several
    pictures, an `<image>` marker stands where each one was, so the record says which picture a question names.

    >>> question(prompts.to_prompt({"id": "1", "question": "<image> then <image> which?", "images": [0, 1]}))[:27]
    '<image> then <image> which?'
    """
    if not row.get("prompt"):
        return str(row.get("question", ""))
    content = row["prompt"][-1]["content"]
    marked = {"image": prompts.IMAGE_PLACEHOLDER, "video": prompts.VIDEO_PLACEHOLDER}
    if isinstance(content, list) and (sum(part.get("type") == "image" for part in content) > 1
                                      or any(part.get("type") == "video" for part in content)):
        return " ".join(marked.get(part.get("type")) or part.get("text", "") for part in content)
    return answers.as_text(content)


def rescore(record: dict) -> dict:
    """`score` of a record from its own fields (completion, gold and scoring columns): the stored values, unless the
    scoring rules changed since the eval.

    >>> item = {"id": "q", "question": "Which is larger?", "answer": "7", "question_type": "multi_choice",
    ...         "choices": ["3", "7"]}
    >>> r = to_record(item, "<REASONING>7 > 3</REASONING><SOLUTION>B</SOLUTION>")
    >>> r["correct"], r["choices"], rescore(r) == {k: r[k] for k in rescore(r)}
    (True, ['3', '7'], True)
    """
    row = {"answer": record.get("gold"), **{k: record.get(k) for k in rewards.META_COLUMNS}}
    return score(record.get("completion"), row, symbolic=bool(record.get("symbolic")))


def to_record(row: dict, completion: str, *, symbolic: bool = False, **generation) -> dict:
    """One eval record: the item (id, the question as the model saw it, gold and its scoring columns), the
    completion and its `score`, what the generation reported (`generation`: prompt_tokens, completion_tokens,
    finish_reason, the decoding settings) and the item's metadata, for the comparison's breakdown.

    >>> r = to_record({"id": "q", "question": "3 + 4?", "answer": "7"}, "<SOLUTION>7</SOLUTION>", finish_reason="stop")
    >>> r["gold"], r["precision"], r["correct"], r["finish_reason"]
    ('7', None, True, 'stop')
    """
    out = {"id": row["id"], "question": question(row), "gold": row.get("answer"),
           **{k: row.get(k) for k in rewards.META_COLUMNS},  # the columns the reward reads: a record rescores alone
           "completion": completion, **score(completion, row, symbolic=symbolic), "symbolic": symbolic, **generation}
    if isinstance(row.get("metadata"), dict):
        out["metadata"] = _jsonable_metadata(row["metadata"])
    video = prompts.row_video(row)
    if video is not None:  # which clip, and which of its frames the model saw
        out["video"] = {"source": video[1].get("source"), "frames": len(video[0]),
                        **{k: video[1].get(k) for k in ("fps", "frames_indices", "total_num_frames")}}
    return out


# --- generation --------------------------------------------------------------------------------------------------

def evaluate(model, processor, dataset, output_path: str | Path, *, batch_size: int = 8, max_new_tokens: int = 1024,
             do_sample: bool = False, temperature: float = 1.0, samples: int = 0, seed: int = 0,
             symbolic: bool = False, thinking_budget: int = 0, fast_generation: bool = False,
             image_dir: str | Path | None = None, progress: bool = True, log=None) -> list[dict]:
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
        batch_size: sequences per generate call (with `samples` K: batch_size // K items, K sequences each).
        max_new_tokens: completion budget; a completion that hits it has finish_reason "length".
        do_sample: greedy (False, the default: the same model gives the same records) or one sampled draw.
        temperature: sampling temperature (used only when sampling).
        samples: K > 0 draws K samples per item (implies sampling) into the record's `draws`, for pass@k.
        seed: seeds the draws: each generate call seeds torch from (seed, its items' ids), so the same model,
            items and batch size give the same samples.
        symbolic: score with symbolic matching too, as the run's reward does (`[training] reward = "symbolic"`).
        thinking_budget: B > 0 caps each completion's thinking at B tokens (`vlrl.engine.Budget`); 0: none.
        fast_generation: on a CUDA GPU, decode with a static KV cache sized to each batch and compiled decoding,
            as training rollouts do (`vlrl.engine`); off: a dynamic cache, eager. The records are the same either
            way, up to floating-point noise; each says which path made it (`decoder`: `vlrl.engine.decoder_of`),
            and a resumed eval takes the same path or is refused, so one file never mixes two decoders.
        image_dir: when given, each item's images are saved there (see `save_images`) for the report.
        progress: show a progress bar.
        log: optional callable for a one-line summary (items, seconds, items/s, accuracy).

    Returns:
        All records in the file for the dataset's ids, in dataset order.

    Raises:
        EvalError: duplicate ids in `dataset`, a damaged line in `output_path`, or records there generated with
            other decoding settings.
    """
    import time

    from tqdm.auto import tqdm

    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    ids = [row["id"] for row in dataset]
    check_unique_ids(ids)
    do_sample = do_sample or samples > 0
    settings = {"max_new_tokens": max_new_tokens, "do_sample": do_sample,
                "temperature": temperature if do_sample else None, "samples": samples,
                "seed": seed if do_sample else None, "thinking_budget": thinking_budget}
    decoding = engine.decoding_for(model, processor, max_new_tokens=max_new_tokens,
                                   temperature=temperature if do_sample else 0.0, thinking_budget=thinking_budget,
                                   static=fast_generation)
    settings["decoder"] = engine.decoder_of(model, decoding)
    drop_torn_tail(output_path)
    existing = read_records(output_path)
    _check_settings(existing, settings, output_path)
    done = {r["id"] for r in existing}
    todo = [row for row in dataset if row["id"] not in done]
    was_training = model.training
    model.eval()
    started = time.time()
    bar = tqdm(total=len(todo), desc=f"eval {output_path.name}", unit="item", disable=not progress)
    try:
        items_per_call = max(1, batch_size // max(1, samples))
        for start in range(0, len(todo), items_per_call):
            batch = todo[start:start + items_per_call]
            lines = [json.dumps(r) + "\n"
                     for r in _generate_batch(model, processor, batch, decoding, settings, symbolic)]
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
        drawn = (f"; pass@1 {sum(r['num_correct'] / samples for r in records) / len(records):.1%} over {samples} "
                 "samples per item") if samples else ""
        if thinking_budget:
            cut = sum(bool(r.get("thinking_cut")) for r in records)
            drawn += f"; the thinking budget ({thinking_budget} tokens) cut {cut} of {len(records)} completions"
        log(f"eval: {len(todo)} items generated ({len(ids) - len(todo)} resumed from {output_path.name}) in "
            f"{seconds:.1f} s ({len(todo) / max(seconds, 1e-9):.2f} items/s); accuracy {accuracy:.1%}{drawn}")
    return records


def check_unique_ids(ids) -> None:
    """Records are keyed by id: an eval set with an id twice is refused (EvalError) before anything is generated."""
    from collections import Counter

    dupes = sorted(i for i, n in Counter(ids).items() if n > 1)[:3]
    if dupes:
        raise EvalError(f"the eval set has duplicate ids (e.g. {dupes}); records are keyed by id, so each item "
                        "needs its own. Deduplicate the rows before evaluating.")


def _generate_batch(model, processor, batch, decoding: engine.Decoding, settings: dict, symbolic: bool) -> list[dict]:
    import torch

    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in batch]
    images = [row_images(r, decode=True) for r in batch]
    draws = max(1, settings["samples"])
    if settings["do_sample"]:
        torch.manual_seed(_batch_seed(settings["seed"], [r["id"] for r in batch]))
    completions = engine.complete(model, processor, texts, images, decoding, draws=draws,
                                  videos=[prompts.row_video(r) for r in batch])
    think_ids, budget = thinking.think_ids(processor), settings["thinking_budget"]
    records = []
    for index, (row, text) in enumerate(zip(batch, texts)):
        turn_start = thinking.opening(text)  # the template's "<think>\n": the assistant's turn starts with it
        scored = []
        for c in completions[index * draws:(index + 1) * draws]:  # item i's draws are rows i*draws .. +draws-1
            kept = c.content_ids
            completion = turn_start + c.text
            scored.append({"completion": completion, **score(completion, row, symbolic=symbolic),
                           "completion_tokens": len(kept), "finish_reason": c.finish_reason,
                           **thinking.thinking_of(kept, think_ids, opened=bool(turn_start), budget=budget)})
        first = scored[0]
        generation = {k: v for k, v in first.items() if k in ("completion_tokens", "finish_reason")
                      or k.startswith("thinking_")}
        record = to_record(row, first["completion"], symbolic=symbolic,
                           prompt_tokens=completions[index * draws].prompt_tokens, **generation, **settings)
        if settings["samples"]:
            record.update(draws=scored, num_correct=sum(d["correct"] for d in scored))
        records.append(record)
    return records


def _batch_seed(seed: int, ids: list) -> int:
    """The torch seed of one generate call: a hash of the eval's seed and its items' ids (stable across runs)."""
    import hashlib

    digest = hashlib.sha256(json.dumps([seed, [str(i) for i in ids]]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)


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
    # records written before these settings existed: greedy or one draw, no thinking budget, decoder not recorded
    defaults = {"samples": 0, "seed": None, "thinking_budget": 0, "decoder": "not recorded"}
    for record in existing:
        old = {k: record.get(k, defaults.get(k)) for k in settings}
        if any(k in record for k in settings) and old != settings:
            differ = ", ".join(f"{k} {old[k]!r} there, {settings[k]!r} now" for k in settings if old[k] != settings[k])
            raise EvalError(f"{path} holds records generated with other settings ({differ}); resume with the same "
                            "settings ([training] fast_generation and the machine choose the decoder), or write to a "
                            "new file.")
