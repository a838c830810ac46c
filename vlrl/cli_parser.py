"""The `vlrl` command's arguments: every subcommand with its description, an example and its flags (`parser()`).

Each subcommand's `--help` says what it does and shows a command to copy; `vlrl.cli` runs what was parsed (the
handler is named by `args.handler`).

    >>> args = parser().parse_args(["compare", "a.jsonl", "b.jsonl"])
    >>> args.handler, args.before, args.output
    ('compare', 'a.jsonl', None)
"""

from __future__ import annotations

import argparse

# What each subcommand does (its --help description) and a command to copy (its --help example), by handler name.
COMMANDS = {
    "run": (("The whole loop into one run directory: load the model, baseline eval, GSPO training, eval after "
            "training, comparison, report.html and a verified adapter. Run it again to resume."),
            "vlrl run --preset tiny --run-dir runs/demo\n  vlrl run --config my_run.toml --set training.max_steps=20"),
    "train": (("GSPO training alone: load the model and the data, train, save the verified adapter. --resume "
              "continues from the last checkpoint; a finished run is left as it is."),
              "vlrl train --config my_run.toml\n  vlrl train --run-dir runs/mine --resume"),
    "sft": (("Supervised warm start (full fine-tuning on worked answers) of the run's model, saved as a checkpoint "
            "RL can start from (RUN_DIR/sft)."),
            "vlrl sft --preset tiny --steps 150"),
    "validate": (("Check a run file or a preset without loading a model: every problem in one pass, then what is "
                  "cheap to build: the environment ([env], reset once; a server's /health) or the first rows of "
                  "local data, and whether the model can load (a local directory, or a hub id cached or answered "
                  "for by the hub: one request, no retries)."),
                 ("vlrl validate my_run.toml\n  vlrl validate --preset grid-tiny --set 'env.options={size=5}'\n  "
                  "vlrl validate qwen3-vl-8b-mathvista --processes 4")),
    "presets": ("The shipped presets, one a line: name, model, and the data or environment it trains on.",
                "vlrl presets"),
    "compare": (("Before/after statistics of two eval record files paired by item id: rates with 95% intervals, the "
                "exact paired test, flipped items. Prints a summary; --output writes the whole comparison as JSON. Given "
                "run directories alone (one config under several training seeds): each run's before/after with its "
                "paired test, and the pooled result."),
                ("vlrl compare runs/demo/eval_before.jsonl runs/demo/eval_after.jsonl --output comparison.json\n"
                 "  vlrl compare runs/grid-seed0 runs/grid-seed1 runs/grid-seed2")),
    "data inspect": (("A data source as a run would load it (what was kept and skipped, and why, and a few prompts "
                     "as the model sees them), or with --config / --preset exactly the items the run trains and "
                     "evaluates on. docs/data.md gives the layouts vlrl reads."),
                     ("vlrl data inspect my_data/ --split train\n  vlrl data inspect --config my_run.toml "
                     "--output data_report.json")),
    "eval": ("Evaluate the run's model, or an adapter, on the run's held-out items (a partial file resumes).",
             "vlrl eval --run-dir runs/demo --adapter runs/demo/adapter\n  vlrl eval --run-dir runs/demo --samples 8"),
    "report": ("Plots and a self-contained report.html of a run directory.", "vlrl report --run-dir runs/demo"),
    "serve-rewards": ("The browser reward calculator on 127.0.0.1 (rewards/, offline once built).",
                      "vlrl serve-rewards --run-dir runs/demo --port 8765"),
    "serve-env": (("Serve an environment on 127.0.0.1 as an OpenEnv-compatible server: HTTP sessions, one per "
                   "episode, and OpenEnv's WebSocket; ENVIRONMENT_API_KEY guards it when set (vlrl.envs.server)."),
                  "vlrl serve-env crafter --port 8766 --set size=128"),
    "env play": ("Play an episode with a model-free policy: its frames, episode.jsonl and a filmstrip.",
                 "vlrl env play grid --seed 3 --steps 20 --output play/grid"),
    "export": ("Export a run's adapter (lora), a merged checkpoint or GGUF files, each read back and verified.",
               "vlrl export --run-dir runs/demo --format gguf"),
}


def _command(sub, name: str, handler: str, short: str):
    """A subcommand whose --help has a description and an example (`COMMANDS[handler]`)."""
    description, example = COMMANDS[handler]
    p = sub.add_parser(name, help=short, description=description, epilog=f"example:\n  {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=handler)
    return p


def _add_config(p, *, run_dir_help: str = "the run directory (default: runs/<the config's name>)",
                default_help: str = "default: tiny") -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--preset", help=f"a shipped preset ({default_help}; `vlrl presets` lists them)")
    source.add_argument("--config", help="a run file (TOML)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a run-file setting, e.g. --set training.max_steps=20 (repeatable)")
    p.add_argument("--run-dir", help=run_dir_help)


def parser() -> argparse.ArgumentParser:
    """The `vlrl` argument parser: every subcommand, with a description and an example in its --help."""
    from vlrl import __version__
    from vlrl.config.runfile import EXPORT_FORMATS
    from vlrl.export.gguf import GGUF_TYPES

    p = argparse.ArgumentParser(prog="vlrl", description="GSPO for vision-language models on one GPU.",
                                epilog="example:\n  vlrl run --preset tiny --run-dir runs/demo   # offline, CPU\n"
                                       "  vlrl presets\n  vlrl <command> --help",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"vlrl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    r = _command(sub, "run", "run", "the whole loop: load, baseline eval, GSPO train, re-eval, report, export")
    _add_config(r)
    t = _command(sub, "train", "train", "GSPO training alone: load the model and data, train, save the adapter")
    _add_config(t, default_help="default: tiny, or the run's own config.toml with --resume")
    t.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint in the run directory (optimizer, scheduler, RNG state)")
    s = _command(sub, "sft", "sft", "supervised warm start (full fine-tuning on worked answers) before RL")
    _add_config(s, run_dir_help="the run directory; the checkpoint goes to RUN_DIR/sft (default: runs/<name>)")
    s.add_argument("--steps", type=int, help="optimizer steps, at least 1 (default: [model] warm_start_steps, "
                   "else 150)")
    s.add_argument("--learning-rate", type=float, help="peak learning rate (default: 3e-3, 1e-3 for tiny-small)")
    s.add_argument("--batch-size", type=int, default=16, help="items per step (default: 16)")
    v = _command(sub, "validate", "validate", "check a run file or preset without loading a model")
    v.add_argument("target", nargs="?", help="a run file (TOML) or a preset name (or --config / --preset)")
    named = v.add_mutually_exclusive_group()
    named.add_argument("--config", help="a run file (TOML)")
    named.add_argument("--preset", help="a preset name (vlrl presets lists them)")
    v.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="check with this override applied")
    v.add_argument("--processes", type=int, help="check for a launch of this many processes (default: this one's)")
    _command(sub, "presets", "presets", "list the shipped presets: name, model, data or environment")
    c = _command(sub, "compare", "compare", "before/after statistics from two eval record files, or across the "
                 "runs of one config under several training seeds")
    c.add_argument("before", help="an eval record file, e.g. RUN_DIR/eval_before.jsonl; or a run directory")
    c.add_argument("after", help="an eval record file, e.g. RUN_DIR/eval_after.jsonl; or a run directory")
    c.add_argument("runs", nargs="*", metavar="RUN_DIR",
                   help="more run directories: with run directories alone, each run's before/after with its paired "
                        "test and the pooled result across the runs (one config, several training seeds)")
    c.add_argument("--samples", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="two sampled eval files ([eval] samples = K) for pass@k, or for episodes success@k and "
                        "achievements@k (default: samples_before/after.jsonl beside the two eval files, if there)")
    c.add_argument("--output", help="write the whole comparison as JSON to this file")
    d = sub.add_parser("data", help="inspect data sources", description="Data sources: `vlrl data inspect`.",
                       epilog=f"example:\n  {COMMANDS['data inspect'][1]}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    i = _command(d.add_subparsers(dest="data_command", required=True, metavar="inspect"), "inspect", "data inspect",
                 "a source's DataReport and prompts, or (--config/--preset) a run's exact items")
    i.add_argument("source", nargs="?", help="a hub id (owner/name), a local directory or file, or 'synthetic'")
    source = i.add_mutually_exclusive_group()
    source.add_argument("--preset", help="show the items this preset's run trains and evaluates on")
    source.add_argument("--config", help="show the items this run file's run trains and evaluates on")
    i.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a run-file setting")
    i.add_argument("--split", help="default: testmini (MathVista), train (geo3k, generic)")
    i.add_argument("--loader", choices=["auto", "mathvista", "geo3k", "virl39k", "generic"], default="auto")
    i.add_argument("-n", type=int, default=3, help="prompts to print (default 3; with a run: of each part)")
    i.add_argument("--all-answers", action="store_true", help="keep non-numeric answers (numeric_only off)")
    i.add_argument("--image-size", type=int, default=512, help="square side; 0 keeps each image's size")
    i.add_argument("--keep-aspect", action="store_true", help="pad to square instead of stretching")
    i.add_argument("--max-images", type=int, default=1, help="pictures kept per item; the rest dropped, counted")
    i.add_argument("--min-pixels", type=int, default=0, help="with --processor: the pixel budget's lower bound")
    i.add_argument("--max-pixels", type=int, default=0,
                   help="with --processor: the pixel budget's upper bound (image tokens per item are shown)")
    i.add_argument("--video-key", help="the video column (a file's path or a list of frames a row)")
    i.add_argument("--video-fps", type=float, default=2.0, help="frames kept per second of a clip (default 2)")
    i.add_argument("--max-frames", type=int, default=16, help="frames kept per clip at most (default 16; 0: no cap)")
    i.add_argument("--video-max-pixels", type=int, default=0,
                   help="with --processor: a clip's pixel budget, all frames together (video tokens per clip shown)")
    i.add_argument("--prompt-key", help="the question column (default: the loader's)")
    i.add_argument("--answer-key", help="the answer column (default: the loader's)")
    i.add_argument("--image-key", action="append", help="an image column (repeatable; default: the loader's)")
    i.add_argument("--id-key", help="the id column (default: the loader's)")
    i.add_argument("--system-prompt", help="a system turn for every prompt")
    i.add_argument("--processor", help="a model directory: render with its chat template and count prompt tokens")
    i.add_argument("--max-prompt-tokens", type=int, help="with --processor: apply the length filter")
    i.add_argument("--num-items", type=int, default=12, help="synthetic only")
    i.add_argument("--tasks", default="all", help="synthetic only: 'all' or one task name")
    i.add_argument("--output", help="also save the DataReport as JSON here (with --config / --preset: the run's)")
    e = _command(sub, "eval", "eval", "evaluate a model/adapter on a run's held-out set (resumes a partial file)")
    _add_config(e, run_dir_help="the run whose held-out set to use (default: runs/<name> of --config/--preset)",
                default_help="default: the run directory's config.toml")
    e.add_argument("--adapter", help="a LoRA adapter directory to apply (e.g. RUN_DIR/adapter)")
    e.add_argument("--model", help="the base checkpoint (default: the run's)")
    e.add_argument("--output", help="records file (default: RUN_DIR/eval_adapter.jsonl or eval_base.jsonl)")
    e.add_argument("--batch-size", type=int, help="default: the run's [eval] batch_size")
    e.add_argument("--max-new-tokens", type=int, help="default: the run's [eval] max_new_tokens")
    e.add_argument("--samples", type=int, default=0, metavar="K",
                   help="K seeded samples per item (pass@1..pass@K; what GSPO optimizes) instead of greedy decoding")
    e.add_argument("--temperature", type=float, help="with --samples (default: the run's [eval] temperature, 1.0)")
    e.add_argument("--seed", type=int, help="with --samples: seeds the draws (default: the run's [eval] seed, 0)")
    e.add_argument("--images", choices=("blank", "shuffled", "first", "still"),
                   help="take the pictures away: each replaced by a blank one, or by another item's, or all but an "
                        "item's first blanked; an item's clip alike: every frame blank, another item's clip, or "
                        "`still`: the clip's middle frame held for its whole length, so one frame and no motion "
                        "(does the gain need the picture, every picture, the motion? `vlrl compare` then "
                        "reports what survives; writes eval_*_MODE.jsonl)")
    rp = _command(sub, "report", "report", "plots and a self-contained report.html for a run directory")
    _add_config(rp, run_dir_help="the run directory (default: runs/<name> of --config/--preset)",
                default_help="names runs/<its name>")
    s = _command(sub, "serve-rewards", "serve-rewards", "the browser reward calculator on localhost (offline)")
    s.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1, 0-65535 (0 picks a free one)")
    s.add_argument("--run-dir", help="a run directory whose eval_before/after.jsonl the page loads")
    s.add_argument("--page-dir", help="the folder holding index.html (default: the checkout's rewards/)")
    s.add_argument("--pyodide", help="the Pyodide runtime folder (default: rewards/node_modules/pyodide)")
    env_set = {"action": "append", "metavar": "KEY=VALUE", "help": "an environment option, e.g. size=128 (repeatable)"}
    se = _command(sub, "serve-env", "serve-env", "serve an environment on 127.0.0.1 as an OpenEnv-compatible server")
    se.add_argument("name", help="an environment name (crafter, grid, gymnasium:ID, ...)")
    se.add_argument("--port", type=int, default=8766, help="TCP port, 0-65535 (0 picks a free one)")
    se.add_argument("--max-sessions", type=int, default=64, help="episodes open at once (default 64)")
    se.add_argument("--max-steps", type=int, default=100_000, help="steps of one episode (default 100,000)")
    se.add_argument("--idle-s", type=float, default=600.0, help="seconds before an idle session expires (default 600)")
    se.add_argument("--set", **env_set)
    ep = sub.add_parser("env", help="environments without a model", description="Environments without a model: "
                        "`vlrl env play`.", epilog=f"example:\n  {COMMANDS['env play'][1]}",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pl = _command(ep.add_subparsers(dest="env_command", required=True, metavar="play"), "play", "env play",
                  "play an episode with a model-free policy: frames, episode.jsonl, filmstrip")
    pl.add_argument("name", help="an environment name, or a `vlrl serve-env` URL (http://127.0.0.1:PORT)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--policy", choices=["random", "noop"], default="random")
    pl.add_argument("--steps", type=int, default=20, help="turns at most (default 20)")
    pl.add_argument("--output", default="play", help="the folder for the files (default: play/)")
    pl.add_argument("--set", **env_set)
    x = _command(sub, "export", "export", "export a run's adapter, a merged checkpoint or GGUF files, verified")
    _add_config(x, run_dir_help="the run directory (default: runs/<name> of --config/--preset)",
                default_help="names runs/<its name>")
    x.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    x.add_argument("--output", help="where the export goes (default: RUN_DIR/adapter, merged16, merged4 or gguf)")
    x.add_argument("--base", help="the base checkpoint (default: the adapter's); give the 16-bit model when the "
                   "adapter was trained on a 4-bit one")
    x.add_argument("--outtype", default="f16", choices=GGUF_TYPES, help="GGUF weight type")
    return p
