"""The `vlrl` command: `vlrl run | validate | compare` (more stages join as they land).

    vlrl run --preset tiny --output-dir runs/demo
    vlrl validate my_run.toml
    vlrl compare runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl --output comparison.json
    vlrl serve-rewards --port 8765 --run runs/demo
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
    s = sub.add_parser("serve-rewards", help="the browser reward calculator on localhost (rewards/, offline)")
    s.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (0 picks a free one)")
    s.add_argument("--run", help="a run directory whose eval_before/after.jsonl the page loads")
    s.add_argument("--page-dir", help="the folder holding index.html (default: the checkout's rewards/)")
    s.add_argument("--pyodide", help="the Pyodide runtime folder (default: rewards/node_modules/pyodide)")
    s.set_defaults(func=cmd_serve_rewards)
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
