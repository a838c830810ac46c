"""The `vlrl` command: `vlrl run | data | train | sft | eval | compare | report | export | validate | serve-rewards`.

    vlrl run --preset tiny --output-dir runs/demo
    vlrl train --config my_run.toml --output-dir runs/mine [--resume]
    vlrl sft --preset tiny --output-dir runs/warm
    vlrl validate my_run.toml
    vlrl eval runs/demo --adapter runs/demo/adapter      # resumable; -> runs/demo/eval_adapter.jsonl
    vlrl compare runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl --output comparison.json
    vlrl data inspect data/mathvista_sample
    vlrl report runs/demo                                # -> runs/demo/report.html
    vlrl serve-rewards --port 8765 --run runs/demo
    vlrl export runs/demo --format gguf
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _config(args):
    from vlrl import config

    if args.config:
        return config.load(args.config)
    return config.preset(args.preset)


def _activate(config) -> None:
    """Imports Unsloth (when the run uses it) before anything imports transformers or TRL, as Unsloth requires."""
    from vlrl.config import ConfigError
    from vlrl.model import activate_backend

    try:
        activate_backend(config.model.backend)
    except (ValueError, ImportError) as err:
        raise ConfigError(str(err)) from None


def cmd_run(args) -> int:
    config = _config(args)
    _activate(config)
    from vlrl.run import run

    run(config, args.output_dir or f"runs/{args.preset or 'run'}")
    return 0


def cmd_train(args) -> int:
    from pathlib import Path

    from vlrl import config as cfg

    if args.config or args.preset:
        config = _config(args)
    elif args.resume:  # resume with the run file the run started with
        if not args.output_dir or not (Path(args.output_dir) / "config.toml").exists():
            raise cfg.ConfigError(f"--resume: no run to resume in {args.output_dir or '(no --output-dir)'}: it has "
                                  "no config.toml; give the run's --output-dir, or --config to start a new run.")
        config = cfg.load(Path(args.output_dir) / "config.toml")
    else:
        config = cfg.preset("tiny")
    _activate(config)
    from vlrl.train import train

    train(config, run_dir=args.output_dir or f"runs/{config.name}", resume=args.resume)
    return 0


def cmd_sft(args) -> int:
    config = _config(args)
    from vlrl.train import sft_from_config

    sft_from_config(config, args.output_dir or f"runs/{config.name}-sft", steps=args.steps,
                    learning_rate=args.learning_rate, batch_size=args.batch_size)
    return 0


def cmd_validate(args) -> int:
    from vlrl import config

    config.load(args.file)
    print(f"{args.file}: ok")
    return 0


def cmd_compare(args) -> int:
    from vlrl.evaluate import compare, summary

    for path in (args.before, args.after):
        if not os.path.exists(path):
            raise FileNotFoundError(f"no record file at {path}")
    try:
        result = compare(args.before, args.after)
    except ValueError as err:  # a record without id/correct/format_ok, an id twice, a damaged line
        print(f"vlrl compare: {err}", file=sys.stderr)
        return 1
    if not args.output:
        print(json.dumps(result, indent=2))
        return 0
    with open(args.output, "w") as f:
        f.write(json.dumps(result, indent=2))
    print(f"{summary(result)}\n-> {args.output}")
    return 0


def cmd_eval(args) -> int:
    """Evaluates a model (the run's base model, or --model) with an optional adapter on the run's held-out set."""
    from pathlib import Path

    from vlrl import config, evaluate, model, prompts, run

    run_dir = Path(args.run_dir)
    conf = config.load(run_dir / "config.toml")
    policy, processor = model.load_model(args.model or run.resolve_model_path(conf.model, conf.data),
                                         load_in_4bit=conf.model.load_in_4bit,
                                         max_seq_length=conf.model.max_seq_length, backend=conf.model.backend)
    if args.adapter:
        from peft import PeftModel

        policy = PeftModel.from_pretrained(policy, args.adapter)
    # The held-out split is a pure function of the config (source, hold_out, seed): the same items as the run's.
    _, held_out = run.split(conf, run.load_rows(conf.data))
    eval_ds, _ = prompts.filter_by_length(prompts.to_dataset(held_out), processor, conf.data.max_prompt_tokens)
    name = ("eval_adapter" if args.adapter else "eval_base") + ("_sampled" if args.sample else "")
    output = args.output or run_dir / f"{name}.jsonl"
    if args.sample:
        import torch

        torch.manual_seed(args.seed)  # the same seed, batch size and model draw the same samples
    records = evaluate.evaluate(policy, processor, eval_ds, output,
                                batch_size=args.batch_size or conf.eval.batch_size,
                                max_new_tokens=args.max_new_tokens or conf.eval.max_new_tokens,
                                do_sample=args.sample, temperature=args.temperature,
                                image_dir=run_dir / "eval_images", log=print)
    print(f"{len(records)} records -> {output}")
    return 0


def cmd_report(args) -> int:
    from vlrl.report import render

    render(args.run_dir, log=print)
    return 0


def cmd_data_inspect(args) -> int:
    """Loads a source as a run would, prints its DataReport and a few prompts exactly as the model sees them."""
    from vlrl import data, prompts, synthetic

    try:
        if args.source == "synthetic":
            rows = synthetic.generate(args.num_items, seed=0, image_size=args.image_size or 128, tasks=args.tasks)
            report = data.DataReport(source="synthetic", rows_read=len(rows), rows_kept=len(rows))
        else:
            loader = args.loader
            if loader == "auto":
                loader = "geo3k" if "geo3k" in args.source.lower() or "geometry3k" in args.source.lower() else \
                    "mathvista"
            options = {"numeric_only": not args.all_answers, "image_size": args.image_size or None,
                       "keep_aspect": args.keep_aspect, "max_images": args.max_images, "return_report": True,
                       "log": lambda _: None}
            if loader == "generic":
                options.update(prompt_key=args.prompt_key, answer_key=args.answer_key, image_keys=args.image_key,
                               id_key=args.id_key, system_prompt=args.system_prompt)
            load = {"mathvista": data.load_mathvista, "geo3k": data.load_geo3k, "generic": data.load_generic}[loader]
            rows, report = load(args.source, split=args.split or {"geo3k": "train", "generic": "train"}.get(
                loader, "testmini"), **options)
        processor = None
        if args.processor:
            from transformers import AutoProcessor

            processor = AutoProcessor.from_pretrained(args.processor)
        prompts = prompts.to_dataset(rows)
        if processor is not None and args.max_prompt_tokens:
            prompts, _ = prompts.filter_by_length(prompts, processor, args.max_prompt_tokens, report=report, part="all")
    except data.DataError as err:
        print(f"vlrl data inspect: {err}", file=sys.stderr)
        return 1
    print(report)
    for row in prompts.select(range(min(args.n, len(prompts)))):
        images = prompts.row_images(row)
        sizes = ", ".join(f"{image.size[0]}x{image.size[1]} {image.mode}" for image in images)
        print(f"\n--- {row['id']}: answer {row['answer']!r} ({row['question_type']}, {row['answer_type']}), "
              f"image {sizes}" + (f", {prompts.prompt_tokens(processor, row)} prompt tokens" if processor else ""))
        print(prompts.render_prompt(row, processor))
    if args.output:
        report.save(args.output)
        print(f"\nreport saved to {args.output}")
    return 0


def cmd_serve_rewards(args) -> int:
    from vlrl.serve import make_server, page_url

    try:
        server = make_server(args.port, run_dir=args.run, page=args.page_dir, pyodide=args.pyodide)
    except FileNotFoundError:
        raise
    except OSError as err:  # the port is taken
        print(f"vlrl serve-rewards: cannot listen on 127.0.0.1:{args.port} ({err.strerror}); pass another --port, "
              "or --port 0 for a free one.", file=sys.stderr)
        return 1
    print(f"reward calculator: {page_url(server, with_run=args.run is not None)}   (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_export(args) -> int:
    from vlrl.export import ExportError, export_run

    try:
        result = export_run(args.run_dir, args.format, output_dir=args.output_dir, base=args.base,
                            outtype=args.outtype)
    except (ExportError, ImportError) as err:  # a failed check, or a missing extra (gguf, gpu)
        print(f"vlrl export: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlrl", description="GSPO for vision-language models on one GPU.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the whole loop: load, baseline eval, GSPO train, re-eval, export")
    source = r.add_mutually_exclusive_group()
    source.add_argument("--preset", default="tiny", help="a shipped preset (default: tiny, offline on CPU)")
    source.add_argument("--config", help="a run file (TOML)")
    r.add_argument("--output-dir", help="the run directory (default: runs/<preset>)")
    r.set_defaults(func=cmd_run)
    t = sub.add_parser("train", help="GSPO training alone: load the model and data, train, save the adapter")
    source = t.add_mutually_exclusive_group()
    source.add_argument("--preset", help="a shipped preset (default: tiny, or the run's own config.toml on --resume)")
    source.add_argument("--config", help="a run file (TOML)")
    t.add_argument("--output-dir", help="the run directory (default: runs/<name>)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint in the run directory (optimizer, scheduler, RNG state)")
    t.set_defaults(func=cmd_train)
    s = sub.add_parser("sft", help="supervised warm start (full fine-tuning on worked answers) before RL")
    source = s.add_mutually_exclusive_group()
    source.add_argument("--preset", default="tiny", help="a shipped preset (default: tiny)")
    source.add_argument("--config", help="a run file (TOML)")
    s.add_argument("--output-dir", help="where the warm-started checkpoint goes (default: runs/<name>-sft)")
    s.add_argument("--steps", type=int, help="optimizer steps (default: [model] warm_start_steps, else 150)")
    s.add_argument("--learning-rate", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    s.add_argument("--batch-size", type=int, default=16, help="items per step (default: 16)")
    s.set_defaults(func=cmd_sft)
    v = sub.add_parser("validate", help="check a run file without loading anything; exits 1 on errors")
    v.add_argument("file")
    v.set_defaults(func=cmd_validate)
    c = sub.add_parser("compare", help="before/after statistics from two eval record files")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--output", help="write the comparison JSON here (and print a summary)")
    c.set_defaults(func=cmd_compare)
    d = sub.add_parser("data", help="inspect data sources").add_subparsers(dest="data_command", required=True)
    i = d.add_parser("inspect", help="load a source, print its DataReport and a few rendered prompts")
    i.add_argument("source", help="a hub id, a local directory or file, or 'synthetic'")
    i.add_argument("--split", help="default: testmini (MathVista), train (geo3k, generic)")
    i.add_argument("--loader", choices=["auto", "mathvista", "geo3k", "generic"], default="auto")
    i.add_argument("-n", type=int, default=3, help="prompts to print (default 3)")
    i.add_argument("--all-answers", action="store_true", help="keep non-numeric answers (numeric_only off)")
    i.add_argument("--image-size", type=int, default=512, help="square side; 0 keeps each image's size")
    i.add_argument("--keep-aspect", action="store_true", help="pad to square instead of stretching")
    i.add_argument("--max-images", type=int, default=1)
    i.add_argument("--prompt-key", help="generic loader: the question column")
    i.add_argument("--answer-key", help="generic loader: the answer column")
    i.add_argument("--image-key", action="append", help="generic loader: an image column (repeatable)")
    i.add_argument("--id-key", help="generic loader: the id column")
    i.add_argument("--system-prompt", help="generic loader: a system turn for every prompt")
    i.add_argument("--processor", help="a model directory: render with its chat template and count prompt tokens")
    i.add_argument("--max-prompt-tokens", type=int, help="with --processor: apply the length filter")
    i.add_argument("--num-items", type=int, default=12, help="synthetic only")
    i.add_argument("--tasks", default="all", help="synthetic only: 'all' or one task name")
    i.add_argument("--output", help="also save the DataReport as JSON here")
    i.set_defaults(func=cmd_data_inspect)
    e = sub.add_parser("eval", help="evaluate a model/adapter on a run's held-out set (resumes a partial file)")
    e.add_argument("run_dir")
    e.add_argument("--adapter", help="a LoRA adapter directory to apply (e.g. RUN_DIR/adapter)")
    e.add_argument("--model", help="the base checkpoint (default: the run's)")
    e.add_argument("--output", help="records file (default: RUN_DIR/eval_adapter.jsonl or eval_base.jsonl)")
    e.add_argument("--batch-size", type=int, help="default: the run's [eval] batch_size")
    e.add_argument("--max-new-tokens", type=int, help="default: the run's [eval] max_new_tokens")
    e.add_argument("--sample", action="store_true",
                   help="sample one completion per item (what GSPO optimizes) instead of greedy decoding")
    e.add_argument("--temperature", type=float, default=1.0, help="with --sample (default 1.0, the recipe's)")
    e.add_argument("--seed", type=int, default=0, help="with --sample: seeds the draws (default 0)")
    e.set_defaults(func=cmd_eval)
    rp = sub.add_parser("report", help="plots and a self-contained report.html for a run directory")
    rp.add_argument("run_dir")
    rp.set_defaults(func=cmd_report)
    s = sub.add_parser("serve-rewards", help="the browser reward calculator on localhost (rewards/, offline)")
    s.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (0 picks a free one)")
    s.add_argument("--run", help="a run directory whose eval_before/after.jsonl the page loads")
    s.add_argument("--page-dir", help="the folder holding index.html (default: the checkout's rewards/)")
    s.add_argument("--pyodide", help="the Pyodide runtime folder (default: rewards/node_modules/pyodide)")
    s.set_defaults(func=cmd_serve_rewards)
    x = sub.add_parser("export", help="export a run's adapter (lora), a merged checkpoint or GGUF files, verified")
    x.add_argument("run_dir")
    x.add_argument("--format", required=True, choices=["lora", "merged16", "merged4", "gguf"])
    x.add_argument("--output-dir", help="default: RUN_DIR/adapter, merged16, merged4 or gguf")
    x.add_argument("--base", help="the base checkpoint (default: the adapter's); give the 16-bit model when the "
                   "adapter was trained on a 4-bit one")
    x.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"], help="GGUF weight type")
    x.set_defaults(func=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    from vlrl.config import ConfigError

    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"vlrl {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
