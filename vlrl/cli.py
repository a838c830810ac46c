"""The `vlrl` command: `vlrl run | train | sft | validate | compare` (more stages join as they land).

    vlrl run --preset tiny --output-dir runs/demo
    vlrl train --config my_run.toml --output-dir runs/mine [--resume]
    vlrl sft --preset tiny --output-dir runs/warm
    vlrl validate my_run.toml
    vlrl compare runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl --output comparison.json
"""

from __future__ import annotations

import argparse
import json
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
    from vlrl.evaluate import compare

    result = compare(args.before, args.after)
    text = json.dumps(result, indent=2)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    print(text)
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
    c.add_argument("--output")
    c.set_defaults(func=cmd_compare)
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
