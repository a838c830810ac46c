"""The `vlrl` command: `vlrl run | validate | compare | export` (more stages join as they land).

    vlrl run --preset tiny --output-dir runs/demo
    vlrl validate my_run.toml
    vlrl compare runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl --output comparison.json
    vlrl export runs/demo --format gguf
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
    from vlrl.evaluate import compare

    result = compare(args.before, args.after)
    text = json.dumps(result, indent=2)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    print(text)
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
    v = sub.add_parser("validate", help="check a run file without loading anything; exits 1 on errors")
    v.add_argument("file")
    v.set_defaults(func=cmd_validate)
    c = sub.add_parser("compare", help="before/after statistics from two eval record files")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--output")
    c.set_defaults(func=cmd_compare)
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
