"""The `vlrl` command: `vlrl run | validate | eval | compare | report` (more stages join as they land).

    vlrl run --preset tiny --output-dir runs/demo
    vlrl validate my_run.toml
    vlrl eval runs/demo --adapter runs/demo/adapter      # resumable; -> runs/demo/eval_adapter.jsonl
    vlrl compare runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl --output comparison.json
    vlrl report runs/demo                                # -> runs/demo/report.html
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


def cmd_run(args) -> int:
    from vlrl.run import run

    run(_config(args), args.output_dir or f"runs/{args.preset or 'run'}")
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

    from vlrl import config, data, evaluate, model, run

    run_dir = Path(args.run_dir)
    conf = config.load(run_dir / "config.toml")
    policy, processor = model.load_model(args.model or run.resolve_model_path(conf.model, conf.data),
                                         load_in_4bit=conf.model.load_in_4bit,
                                         max_seq_length=conf.model.max_seq_length, backend=conf.model.backend)
    if args.adapter:
        from peft import PeftModel

        policy = PeftModel.from_pretrained(policy, args.adapter)
    # The held-out split is a pure function of the config (source, hold_out, seed): the same items as the run's.
    _, held_out = data.split_holdout(run.load_rows(conf.data), conf.data.hold_out, seed=conf.data.seed)
    eval_ds, _ = data.filter_by_length(data.to_dataset(held_out), processor, conf.data.max_prompt_tokens)
    output = args.output or run_dir / ("eval_adapter.jsonl" if args.adapter else "eval_base.jsonl")
    records = evaluate.evaluate(policy, processor, eval_ds, output,
                                batch_size=args.batch_size or conf.eval.batch_size,
                                max_new_tokens=args.max_new_tokens or conf.eval.max_new_tokens,
                                image_dir=run_dir / "eval_images", log=print)
    print(f"{len(records)} records -> {output}")
    return 0


def cmd_report(args) -> int:
    from vlrl.report import render

    render(args.run_dir, log=print)
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
    v = sub.add_parser("validate", help="check a run file without loading anything; exits 1 on errors")
    v.add_argument("file")
    v.set_defaults(func=cmd_validate)
    c = sub.add_parser("compare", help="before/after statistics from two eval record files")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--output", help="write the comparison JSON here (and print a summary)")
    c.set_defaults(func=cmd_compare)
    e = sub.add_parser("eval", help="evaluate a model/adapter on a run's held-out set (resumes a partial file)")
    e.add_argument("run_dir")
    e.add_argument("--adapter", help="a LoRA adapter directory to apply (e.g. RUN_DIR/adapter)")
    e.add_argument("--model", help="the base checkpoint (default: the run's)")
    e.add_argument("--output", help="records file (default: RUN_DIR/eval_adapter.jsonl or eval_base.jsonl)")
    e.add_argument("--batch-size", type=int, help="default: the run's [eval] batch_size")
    e.add_argument("--max-new-tokens", type=int, help="default: the run's [eval] max_new_tokens")
    e.set_defaults(func=cmd_eval)
    rp = sub.add_parser("report", help="plots and a self-contained report.html for a run directory")
    rp.add_argument("run_dir")
    rp.set_defaults(func=cmd_report)
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
