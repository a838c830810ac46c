"""`run()`: the whole loop in one run directory — load -> baseline eval -> GSPO train -> re-eval -> adapter export.

Each stage writes its result into the run directory, so the CLI (`vlrl run`), a notebook cell or a script can run
or re-run any stage and see the same files:

    config.toml  data_report.json  eval_before.jsonl  eval_images/  grpo_config.json  train_log.jsonl
    checkpoints/  eval_after.jsonl  comparison.json  plots/  report.html  adapter/
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vlrl import config as cfg
from vlrl import data, evaluate, export, model, prompts, report, synthetic, train


def banner(text: str, log=print) -> None:
    log(f"\n=== {text} " + "=" * max(0, 72 - len(text)))


def resolve_model_path(model_config: cfg.ModelConfig, data_config: cfg.DataConfig, log=print) -> str:
    """The checkpoint to load: `tiny` / `tiny-small` build (and warm-start) a local Qwen3-VL; others are as given."""
    if model_config.name_or_path not in cfg.LOCAL_MODELS:
        return model_config.name_or_path
    from vlrl.tiny import ensure_tiny

    return str(ensure_tiny(warm_start_steps=model_config.warm_start_steps, log=log,
                           size=cfg.LOCAL_MODELS[model_config.name_or_path],
                           **_warm_start_settings(model_config, data_config)))


def _warm_start_settings(model_config: cfg.ModelConfig, data_config: cfg.DataConfig) -> dict:
    """What the warm start draws its items from: the one source for building it and for keeping its pictures out
    of the held-out set."""
    size = cfg.LOCAL_MODELS[model_config.name_or_path]
    return {"seed": data_config.seed, "image_size": data_config.image_size, "difficulty": data_config.difficulty,
            "tasks": tuple(data_config.tasks or synthetic.TASKS),
            "warm_start_items": model_config.warm_start_items or (512 if size == "tiny" else 4096)}


def split(config: cfg.RunConfig, rows, report: data.DataReport | None = None):
    """(train, held_out) rows: `data.split_holdout` with the run's hold_out and seed. For the models vlrl warm-starts
    itself, no held-out item shows a picture the warm start trained on, so the eval measures reading, not recall.
    A pure function of the configuration: `vlrl eval` gets the run's own held-out items back."""
    m = config.model
    seen = set()
    if m.name_or_path in cfg.LOCAL_MODELS and m.warm_start_steps:
        from vlrl.tiny import warm_start_data

        warm_items = warm_start_data(**_warm_start_settings(m, config.data))
        seen = {data.image_hash(item["image"]) for item in warm_items}
    return data.split_holdout(rows, config.data.hold_out, seed=config.data.seed, report=report, exclude_images=seen)


def load_base(config: cfg.RunConfig, log=print):
    """The configured checkpoint and its processor, not yet wrapped (4-bit when [model] load_in_4bit)."""
    path = resolve_model_path(config.model, config.data, log)
    m = config.model
    base, processor = model.load_model(path, load_in_4bit=m.load_in_4bit, max_seq_length=m.max_seq_length,
                                       backend=m.backend)
    log(f"model: {path}")
    return base, processor


def wrap_lora(config: cfg.RunConfig, base):
    """`base` LoRA-wrapped as [model] says: the language model adapted, the vision tower frozen unless asked."""
    m = config.model
    return model.add_lora(base, model.LoraSettings(r=m.lora_r, alpha=m.lora_alpha, dropout=m.lora_dropout,
                                                   train_projector=m.train_projector, seed=config.training.seed),
                          finetune_vision_layers=m.finetune_vision_layers, backend=model.choose_backend(m.backend))


def load_policy(config: cfg.RunConfig, log=print):
    """The configured model, LoRA-wrapped (vision frozen unless asked), and its processor."""
    base, processor = load_base(config, log)
    policy = wrap_lora(config, base)
    log(f"LoRA: {model.trainable_summary(policy)}")
    return policy, processor


def load_rows(data_config: cfg.DataConfig, *, return_report: bool = False):
    """Canonical rows for the configured source: generated items (a list), or MathVista / geo3k (a Dataset).

    A source whose name mentions geometry3k or geo3k is read with `data.load_geo3k`; any other hub id or local
    directory with `data.load_mathvista`. With `return_report`, also the `data.DataReport` of the load.
    """
    if data_config.source == "synthetic":
        rows = synthetic.generate(data_config.num_items, seed=data_config.seed, image_size=data_config.image_size,
                                  difficulty=data_config.difficulty, tasks=data_config.tasks or synthetic.TASKS)
        report = data.DataReport(source="synthetic", rows_read=len(rows), rows_kept=len(rows),
                                 image_size=data_config.image_size)
    else:
        name = data_config.source.lower()
        loader = data.load_geo3k if ("geometry3k" in name or "geo3k" in name) else data.load_mathvista
        rows, report = loader(data_config.source, split=data_config.split, image_size=data_config.image_size,
                              return_report=True)
    return (rows, report) if return_report else rows


def prepare(config: cfg.RunConfig, processor, run_dir: Path, log=print):
    """Loads, splits and length-filters the data; writes data_report.json. Returns (train_dataset, eval_dataset).

    The held-out set is disjoint from training by id and by picture (`split`), checked again on the final datasets (`data.check_disjoint`) so no eval item is ever trained on.
    """
    rows, report = load_rows(config.data, return_report=True)
    train_rows, held_out = split(config, rows, report)
    max_tokens = config.data.max_prompt_tokens
    train_ds, dropped_train = prompts.filter_by_length(prompts.to_dataset(train_rows), processor, max_tokens,
                                                    report=report, part="train")
    eval_ds, dropped_eval = prompts.filter_by_length(prompts.to_dataset(held_out), processor, max_tokens,
                                                  report=report, part="eval")
    data.check_disjoint(train_ds, eval_ds)
    report.save(run_dir / "data_report.json")
    log(f"data: {report.summary()}")
    log(f"data: {len(train_ds)} training items, {len(eval_ds)} held-out items "
        f"({dropped_train + dropped_eval} dropped as longer than {max_tokens} prompt tokens)")
    return train_ds, eval_ds


def start_run_dir(config: cfg.RunConfig, output_dir: str | Path) -> Path:
    """Creates the run directory and writes config.toml; a directory that holds another configuration's run is
    refused, since its records would mix with this run's (the same configuration continues where it stopped)."""
    run_dir = Path(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    changed = cfg.differences(config, run_dir / "config.toml")
    if changed:
        raise cfg.ConfigError(f"{run_dir} holds a run with a different configuration ({'; '.join(changed)}): its "
                              "records would mix with this run's. Use a new --output-dir, or delete that directory.")
    (run_dir / "config.toml").write_text(cfg.to_toml(config))
    return run_dir


def run(config: cfg.RunConfig, output_dir: str | Path, *, log=print) -> dict:
    """Runs the whole loop into `output_dir`; returns the comparison (also in comparison.json)."""
    started = time.time()
    run_dir = start_run_dir(config, output_dir)

    banner("1/6 model: load and wrap with LoRA (vision frozen)", log)
    policy, processor = load_policy(config, log)

    banner("2/6 data: load, hold out, filter by measured prompt length", log)
    train_ds, eval_ds = prepare(config, processor, run_dir, log)

    banner("3/6 baseline eval", log)
    e = config.eval
    evaluate.evaluate(policy, processor, eval_ds, run_dir / "eval_before.jsonl", batch_size=e.batch_size,
                      max_new_tokens=e.max_new_tokens, image_dir=run_dir / "eval_images", log=log)

    banner("4/6 GSPO training", log)
    # Same configuration as any earlier attempt in this directory (checked above): continue from its checkpoint.
    train.train(config, policy, processor, train_ds, run_dir, resume=True, log=log)

    banner("5/6 eval after training", log)
    # Records from an earlier attempt came from an earlier adapter; only this training's adapter may be scored.
    (run_dir / "eval_after.jsonl").unlink(missing_ok=True)
    evaluate.evaluate(policy, processor, eval_ds, run_dir / "eval_after.jsonl", batch_size=e.batch_size,
                      max_new_tokens=e.max_new_tokens, image_dir=run_dir / "eval_images", log=log)
    comparison = evaluate.compare(run_dir / "eval_before.jsonl", run_dir / "eval_after.jsonl")
    (run_dir / "comparison.json").write_text(json.dumps(comparison, indent=2))
    log(evaluate.summary(comparison))
    report.render(run_dir, log=log)

    banner("6/6 export the adapter (verified from disk)", log)
    export.export_adapter(policy, processor, run_dir / "adapter", run_dir=run_dir, log=log)
    for fmt in config.export.formats:  # merged16, merged4, gguf: each from the saved adapter, verified
        if fmt != "lora":
            export.export_run(run_dir, fmt, log=log)
    log(f"done in {time.time() - started:.0f} s: {run_dir}")
    return comparison
