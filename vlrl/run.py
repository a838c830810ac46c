"""`run()`: the whole loop in one run directory — load -> baseline eval -> GSPO train -> re-eval -> adapter export.

Each stage writes its result into the run directory, so the CLI (`vlrl run`), a notebook cell or a script can run
or re-run any stage and see the same files:

    config.toml  data_report.json  eval_before.jsonl  train_log.jsonl  checkpoints/  eval_after.jsonl
    comparison.json  adapter/
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vlrl import config as cfg
from vlrl import data, evaluate, export, model, synthetic, train


def banner(text: str, log=print) -> None:
    log(f"\n=== {text} " + "=" * max(0, 72 - len(text)))


def resolve_model_path(model_config: cfg.ModelConfig, data_config: cfg.DataConfig, log=print) -> str:
    """The checkpoint to load: `tiny` builds (and warm-starts) the offline tiny Qwen3-VL; anything else is as given."""
    if model_config.name_or_path != "tiny":
        return model_config.name_or_path
    from vlrl.tiny import ensure_tiny

    return str(ensure_tiny(seed=data_config.seed, warm_start_steps=model_config.warm_start_steps,
                           image_size=data_config.image_size, log=log))


def load_rows(data_config: cfg.DataConfig) -> list[dict]:
    """Canonical rows for the configured source."""
    if data_config.source == "synthetic":
        return synthetic.generate(data_config.num_items, seed=data_config.seed, image_size=data_config.image_size,
                                  difficulty=data_config.difficulty)
    from vlrl.data import load_mathvista

    return list(load_mathvista(data_config.source, split=data_config.split, image_size=data_config.image_size))


def prepare(config: cfg.RunConfig, processor, run_dir: Path, log=print):
    """Loads, splits and length-filters the data; writes data_report.json. Returns (train_dataset, eval_dataset)."""
    rows = load_rows(config.data)
    train_rows, held_out = data.split_holdout(rows, config.data.hold_out, seed=config.data.seed)
    data.check_disjoint(train_rows, held_out)
    train_ds, dropped_train = data.filter_by_length(data.to_dataset(train_rows), processor,
                                                    config.data.max_prompt_tokens)
    eval_ds, dropped_eval = data.filter_by_length(data.to_dataset(held_out), processor, config.data.max_prompt_tokens)
    report = {"source": config.data.source, "rows": len(rows), "train": len(train_ds), "eval": len(eval_ds),
              "dropped_too_long": {"train": dropped_train, "eval": dropped_eval},
              "max_prompt_tokens": config.data.max_prompt_tokens}
    (run_dir / "data_report.json").write_text(json.dumps(report, indent=2))
    log(f"data: {report['train']} training items, {report['eval']} held-out items "
        f"({dropped_train + dropped_eval} dropped as longer than {config.data.max_prompt_tokens} prompt tokens)")
    return train_ds, eval_ds


def run(config: cfg.RunConfig, output_dir: str | Path, *, log=print) -> dict:
    """Runs the whole loop into `output_dir`; returns the comparison (also in comparison.json)."""
    started = time.time()
    run_dir = Path(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(cfg.to_toml(config))

    banner("1/6 model: load and wrap with LoRA (vision frozen)", log)
    path = resolve_model_path(config.model, config.data, log)
    m = config.model
    policy, processor = model.load_model(
        path, load_in_4bit=m.load_in_4bit, max_seq_length=m.max_seq_length,
        lora=model.LoraSettings(r=m.lora_r, alpha=m.lora_alpha, dropout=m.lora_dropout),
        finetune_vision_layers=m.finetune_vision_layers, backend=m.backend)
    log(f"model: {path} {model.trainable_summary(policy)}")

    banner("2/6 data: load, hold out, filter by measured prompt length", log)
    train_ds, eval_ds = prepare(config, processor, run_dir, log)

    banner("3/6 baseline eval", log)
    e = config.eval
    evaluate.evaluate(policy, processor, eval_ds, run_dir / "eval_before.jsonl", batch_size=e.batch_size,
                      max_new_tokens=e.max_new_tokens)

    banner("4/6 GSPO training", log)
    train.train(config, policy, processor, train_ds, run_dir)

    banner("5/6 eval after training", log)
    evaluate.evaluate(policy, processor, eval_ds, run_dir / "eval_after.jsonl", batch_size=e.batch_size,
                      max_new_tokens=e.max_new_tokens)
    comparison = evaluate.compare(run_dir / "eval_before.jsonl", run_dir / "eval_after.jsonl")
    (run_dir / "comparison.json").write_text(json.dumps(comparison, indent=2))
    log(f"accuracy {comparison['accuracy_before']:.1%} -> {comparison['accuracy_after']:.1%}, "
        f"format {comparison['format_before']:.1%} -> {comparison['format_after']:.1%}, "
        f"McNemar p = {comparison['mcnemar_p']:.3g}")

    banner("6/6 export the adapter (verified from disk)", log)
    export.export_adapter(policy, processor, run_dir / "adapter", run_dir=run_dir, log=log)
    for fmt in config.export.formats:  # merged16, merged4, gguf: each from the saved adapter, verified
        if fmt != "lora":
            export.export_run(run_dir, fmt, log=log)
    log(f"done in {time.time() - started:.0f} s: {run_dir}")
    return comparison
