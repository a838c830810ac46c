"""Evaluation over every process of a launch: `vlrl.evaluate.evaluate` on each process's share of the items, the
records gathered into the one record file, in item order, by the main process (the only one that writes it).

    records = evaluate(model, processor, eval_ds, "runs/demo/eval_before.jsonl", batch_size=16)

The items still to do go in rounds of (processes x batch_size): in each round process k generates the round's k-th
batch, so every batch holds exactly the items a one-process eval would put together, padding included, and greedy
records equal that eval's, line for line (tests/test_distributed.py). After each round the main process appends the
round's records, so an interrupted eval resumes from its last whole round, as a one-process one resumes from its
last batch. In one process this is `vlrl.evaluate.evaluate` itself.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from vlrl import distributed
from vlrl import evaluate as one_process
from vlrl.errors import EvalError
from vlrl.records import read_records, save_images


def evaluate(model, processor, dataset, output_path: str | Path, *, batch_size: int = 8,
             image_dir: str | Path | None = None, progress: bool = True, log=None, **options) -> list[dict]:
    """`vlrl.evaluate.evaluate` (same arguments, same records, same file) sharded over the launch's processes.

    Args:
        options: decoding and scoring settings, passed to `vlrl.evaluate.evaluate` as they are.

    Returns:
        Every record in `output_path` for the dataset's ids, in dataset order, on every process.
    """
    if distributed.world_size() == 1:
        return one_process.evaluate(model, processor, dataset, output_path, batch_size=batch_size,
                                    image_dir=image_dir, progress=progress, log=log, **options)
    from tqdm.auto import tqdm

    output_path = Path(output_path)
    rows = list(dataset)
    ids = [row["id"] for row in rows]
    duplicated = sorted(i for i, n in Counter(ids).items() if n > 1)[:3]
    if duplicated:  # one process checks its own batches; across them, here
        raise EvalError(f"the eval set has duplicate ids (e.g. {duplicated}); records are keyed by id, so each item "
                        "needs its own. Deduplicate the rows before evaluating.")
    # the file's own checks, as a one-process eval makes them, with nothing to generate: a torn last line dropped,
    # records of other decoding settings refused (on every process at once)
    distributed.on_main(one_process.evaluate, model, processor, [], output_path, progress=False, **options)
    done = {record["id"] for record in read_records(output_path)}
    todo = [row for row in rows if row["id"] not in done]
    world, rank = distributed.world_size(), distributed.rank()
    step = world * batch_size
    started = time.time()
    bar = tqdm(total=len(todo), desc=f"eval {output_path.name}", unit="item",
               disable=not (progress and distributed.is_main()))
    with tempfile.TemporaryDirectory(prefix="vlrl-eval-") as scratch:  # this process's batches, outside the run
        for start in range(0, len(todo), step):
            batch = todo[start + rank * batch_size:start + (rank + 1) * batch_size]
            mine = one_process.evaluate(model, processor, batch, Path(scratch) / f"{start}.jsonl",
                                        batch_size=batch_size, progress=False, **options)
            gathered = distributed.all_gather(mine)
            if distributed.is_main():
                _append(output_path, [record for records in gathered for record in records])
                for row in todo[start:start + step] if image_dir is not None else ():
                    save_images(row, image_dir)
            bar.update(len(todo[start:start + step]))
    bar.close()
    distributed.barrier()  # the main process has written the last round
    by_id = {record["id"]: record for record in read_records(output_path)}
    records = [by_id[i] for i in ids if i in by_id]
    if log is not None and records:
        seconds = time.time() - started
        accuracy = sum(r["correct"] for r in records) / len(records)
        log(f"eval: {len(todo)} items generated over {world} processes ({len(ids) - len(todo)} resumed from "
            f"{output_path.name}) in {seconds:.1f} s ({len(todo) / max(seconds, 1e-9):.2f} items/s); "
            f"accuracy {accuracy:.1%}")
    return records


def _append(path: Path, records: list[dict]) -> None:
    """One append per round, flushed: an interrupt tears at most the last line, which the next eval drops."""
    with path.open("a") as f:
        f.write("".join(json.dumps(record) + "\n" for record in records))
        f.flush()
