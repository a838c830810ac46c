"""The `vlrl` command: `vlrl run | train | sft | eval | compare | report | export | validate | data | serve-rewards |
serve-env | env`.

Every command names a run directory the same way, `--run-dir DIR`; without it, a command started from a run file or
a preset uses runs/<the config's name>. `--set section.key=value` (repeatable) overrides any run-file setting and is
validated like the file.

    vlrl run --preset tiny                                  # -> runs/tiny
    vlrl run --preset grid-tiny                             # an episode run ([env]): -> runs/grid-tiny
    vlrl run --config my_run.toml --set training.max_steps=20
    vlrl train --config my_run.toml [--resume]              # -> runs/<name>
    vlrl sft --preset tiny                                  # -> runs/tiny/sft, a warm-started checkpoint
    vlrl validate my_run.toml | qwen3-vl-8b-mathvista       # every problem in one pass
    vlrl eval --run-dir runs/tiny --adapter runs/tiny/adapter
    vlrl compare runs/tiny/eval_before.jsonl runs/tiny/eval_after.jsonl --output comparison.json
    vlrl data inspect --preset tiny                         # exactly the items the run trains and evaluates on
    vlrl report --run-dir runs/tiny                         # -> runs/tiny/report.html
    vlrl export --run-dir runs/tiny --format gguf
    vlrl serve-rewards --run-dir runs/tiny
    vlrl serve-env crafter --port 8766 --set size=128            # an OpenEnv-compatible server (vlrl.envs.server)
    vlrl env play crafter --seed 3 --steps 20 --output play/     # frames, episode.jsonl, filmstrip.png

A failure a user can act on (`vlrl.errors.VlrlError`) prints one line, `vlrl <command>: <what, which value, the
fix>`, and exits 1; an interrupt exits 130 and keeps what was written (every stage resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# --- resolving what a command works on --------------------------------------------------------------------------

def _config(args, default_preset: str | None = "tiny"):
    """The configuration a command names: --config or --preset (with --set), else the run directory's own
    config.toml when there is one, else `default_preset`."""
    from vlrl import config as cfg
    from vlrl.rundir import RunDir

    overrides = getattr(args, "set", None) or ()
    if getattr(args, "config", None) or getattr(args, "preset", None):
        return cfg.resolve(config=args.config, preset_name=args.preset, overrides=overrides)
    if getattr(args, "run_dir", None) and RunDir(args.run_dir).config_file.exists():
        return cfg.load(RunDir(args.run_dir).config_file, overrides=overrides)
    if default_preset is None:
        from vlrl.errors import RunDirError

        where = f"{args.run_dir} has no config.toml" if getattr(args, "run_dir", None) else "no --run-dir was given"
        resume = "no run to resume: " if getattr(args, "resume", False) else ""
        raise RunDirError(f"{resume}{where}; name the run with --run-dir DIR (a directory `vlrl run` made), or "
                          "--config / --preset to use runs/<its name>.")
    return cfg.preset(default_preset, overrides=overrides)


def _run_dir(args, config):
    from vlrl.rundir import RunDir

    return RunDir.for_config(config, getattr(args, "run_dir", None))


def _named_run_dir(args):
    """The run a command reads: --run-dir, else runs/<name> of --config / --preset."""
    from vlrl.rundir import RunDir

    return RunDir(args.run_dir) if args.run_dir else _run_dir(args, _config(args, default_preset=None))


def _activate(config) -> None:
    """Imports Unsloth (when the run uses it) before anything imports transformers or TRL, as Unsloth requires."""
    from vlrl.errors import ConfigError
    from vlrl.model import activate_backend

    try:
        activate_backend(config.model.backend)
    except (ValueError, ImportError) as err:
        raise ConfigError(str(err)) from None


def _single_turn(config, command: str) -> None:
    """`vlrl train` and `vlrl eval` run single-turn stages; an episode run's are stages of `vlrl run`."""
    if config.env.name:
        from vlrl.errors import ConfigError

        raise ConfigError(f"vlrl {command} runs single-turn stages, and this run file has [env] name = "
                          f"{config.env.name!r}; run the episode loop with `vlrl run` (it resumes training from its "
                          "checkpoints), or call vlrl.episodes.run's stages from Python.")


# --- the commands ---------------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    config = _config(args)
    _activate(config)
    from vlrl.distributed import print_main

    if config.env.name:  # an episode run: [env] names an environment
        from vlrl.episodes.run import run
    else:
        from vlrl.run import run

    run(config, _run_dir(args, config).path, log=print_main)
    return 0


def cmd_train(args) -> int:
    config = _config(args, default_preset=None if args.resume else "tiny")
    _single_turn(config, "train")
    _activate(config)
    from vlrl.distributed import print_main
    from vlrl.run import train_only

    train_only(config, _run_dir(args, config).path, resume=args.resume, log=print_main)
    return 0


def cmd_sft(args) -> int:
    config = _config(args)
    from vlrl.warmstart import sft_from_config

    sft_from_config(config, _run_dir(args, config).path / "sft", steps=args.steps,
                    learning_rate=args.learning_rate, batch_size=args.batch_size)
    return 0


def cmd_validate(args) -> int:
    from vlrl import config as cfg
    from vlrl.distributed import world_size

    config = cfg.resolve(config=args.target, overrides=args.set or (), num_processes=args.processes)
    print(f"{args.target}: ok (run {config.name!r}, {args.processes or world_size()} process(es))")
    return 0


def cmd_compare(args) -> int:
    from vlrl.compare import compare, summary
    from vlrl.errors import EvalError

    for path in (args.before, args.after):
        if not os.path.exists(path):
            raise EvalError(f"no record file at {path}; give two eval files such as RUN_DIR/eval_before.jsonl.")
    result = compare(args.before, args.after)  # damaged or mismatched records raise EvalError themselves
    if not args.output:
        print(json.dumps(result, indent=2))
        return 0
    with open(args.output, "w") as f:
        f.write(json.dumps(result, indent=2))
    print(f"{summary(result)}\n-> {args.output}")
    return 0


def cmd_eval(args) -> int:
    """Evaluates the run's model (or --model) with an optional adapter on the run's held-out set."""
    from vlrl.errors import ConfigError

    if args.samples < 0:
        raise ConfigError(f"--samples {args.samples} must be 0 (greedy) or a number of draws per item, e.g. 8.")
    config = _config(args, default_preset=None)
    _single_turn(config, "eval")
    _activate(config)
    from vlrl import distributed, model, run, sharded_eval, warmstart

    rd = _run_dir(args, config)
    if args.adapter:
        model.require_adapter(args.adapter)
    with distributed.main_first():
        path = args.model or warmstart.model_path(config, log=distributed.print_main)
    policy, processor = model.load_model(path, load_in_4bit=config.model.load_in_4bit,
                                         max_seq_length=config.model.max_seq_length, backend=config.model.backend)
    if args.adapter:
        policy = model.load_adapter(policy, args.adapter)
        policy = run.pack_base(config, policy, log=distributed.print_main)  # as the run's evals decoded
    eval_ds = run.held_out(config, processor)  # the same items as the run's evals: a pure function of the config
    name = ("eval_adapter" if args.adapter else "eval_base") + (f"_samples{args.samples}" if args.samples else "")
    output = args.output or rd.eval_file(name)
    e = config.eval
    records = sharded_eval.evaluate(policy, processor, eval_ds, output, batch_size=args.batch_size or e.batch_size,
                                    max_new_tokens=args.max_new_tokens or e.max_new_tokens, samples=args.samples,
                                    temperature=e.temperature if args.temperature is None else args.temperature,
                                    seed=e.seed if args.seed is None else args.seed,
                                    symbolic=config.training.reward == "symbolic", image_dir=rd.eval_images,
                                    thinking_budget=e.thinking_budget, log=distributed.print_main)
    distributed.print_main(f"{len(records)} records -> {output}")
    return 0


def cmd_report(args) -> int:
    from vlrl.report import render

    render(_named_run_dir(args).path, log=print)
    return 0


def cmd_data_inspect(args) -> int:
    """A source as a run would load it (its DataReport and a few prompts as the model sees them), or, with --config /
    --preset, exactly the items the run trains and evaluates on."""
    from vlrl import data, prompts

    if args.config or args.preset:
        return _inspect_run(args)
    if not args.source:
        from vlrl.errors import ConfigError

        raise ConfigError("vlrl data inspect needs a source (a hub id, a directory or file, or 'synthetic') or "
                          "--config / --preset to show a run's items.")
    processor = _processor(args.processor)
    loader = data.loader_name(args.source) if args.loader == "auto" else args.loader
    if loader == "synthetic":
        rows, report = data.load_synthetic(args.num_items, image_size=args.image_size or 128, tasks=args.tasks,
                                           return_report=True)
    else:
        options = {"image_size": args.image_size or None, "keep_aspect": args.keep_aspect,
                   "max_images": args.max_images, "log": lambda _: None}
        if args.all_answers:  # else each loader's own default: numbers only, but ViRL39K's answers of every kind
            options["numeric_only"] = False
        if loader == "generic":
            options.update(prompt_key=args.prompt_key, answer_key=args.answer_key, image_keys=args.image_key,
                           id_key=args.id_key, system_prompt=args.system_prompt)
        split = {"split": args.split} if args.split else {}  # each loader's own default split otherwise
        rows, report = data.LOADERS[loader](args.source, return_report=True, **split, **options)
    shown = prompts.to_dataset(rows)
    if processor is not None and args.max_prompt_tokens:
        shown, _ = prompts.filter_by_length(shown, processor, args.max_prompt_tokens, report=report, part="all")
    print(report)
    _print_items("", shown, args.n, processor)
    if args.output:
        report.save(args.output)
        print(f"\nreport saved to {args.output}")
    return 0


def _inspect_run(args) -> int:
    from vlrl import run, tiny
    from vlrl.config import LOCAL_MODELS

    config = _config(args)
    size = LOCAL_MODELS.get(config.model.name_or_path)  # a local model's processor is its random base's: no warm start
    model_dir = tiny.ensure_base(seed=config.data.seed, size=size, log=print) if size else config.model.name_or_path
    processor = _processor(args.processor or model_dir, optional=args.processor is None)
    if processor is None:
        print(f"note: no processor for {config.model.name_or_path!r} on this machine (offline?): the items below are "
              "before the length filter ([data] max_prompt_tokens); pass --processor DIR to apply it.")
    train_ds, eval_ds = run.prepare(config, processor, None, log=print)
    kind = "eval" if config.eval.source else "held-out"
    print(f"run {config.name!r}: {len(train_ds)} training items, {len(eval_ds)} {kind} items")
    _print_items("train", train_ds, args.n, processor)
    _print_items(kind, eval_ds, args.n, processor)
    return 0


def _processor(path, optional: bool = False):
    if not path:
        return None
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(path))
    except OSError as err:
        if optional:
            return None
        from vlrl.errors import ConfigError

        raise ConfigError(f"no processor at {path}: {err}") from None


def _print_items(label: str, rows, n: int, processor) -> None:
    from vlrl import prompts

    for row in rows.select(range(min(n, len(rows)))):
        sizes = ", ".join(f"{im.size[0]}x{im.size[1]} {im.mode}" for im in prompts.row_images(row, decode=True))
        tokens = f", {prompts.prompt_tokens(processor, row)} prompt tokens" if processor is not None else ""
        print(f"\n--- {label + ' ' if label else ''}{row['id']}: answer {row['answer']!r} ({row['question_type']}, "
              f"{row['answer_type']}), image {sizes}{tokens}")
        print(prompts.render_prompt(row, processor))


def cmd_serve_rewards(args) -> int:
    from vlrl.serve import make_server, page_url, serve_until_interrupted

    try:
        server = make_server(args.port, run_dir=args.run_dir, page=args.page_dir, pyodide=args.pyodide)
    except FileNotFoundError:
        raise
    except OSError as err:  # the port is taken
        print(f"vlrl serve-rewards: cannot listen on 127.0.0.1:{args.port} ({err.strerror}); pass another --port, "
              "or --port 0 for a free one.", file=sys.stderr)
        return 1
    print(f"reward calculator: {page_url(server, with_run=args.run_dir is not None)}   (Ctrl-C stops it)", flush=True)
    serve_until_interrupted(server)
    return 0


def cmd_serve_env(args) -> int:
    from vlrl.envs import parse_options
    from vlrl.envs.server import serve

    serve(args.name, parse_options(args.set), port=args.port, max_sessions=args.max_sessions,
          max_steps=args.max_steps, idle_s=args.idle_s, log=lambda line: print(line, flush=True))
    return 0


def cmd_env_play(args) -> int:
    from vlrl.envs import parse_options
    from vlrl.envs.play import play

    play(args.name, seed=args.seed, policy=args.policy, steps=args.steps, output=args.output,
         options=parse_options(args.set), log=print)
    return 0


def cmd_export(args) -> int:
    from vlrl.export import export_run

    result = export_run(_named_run_dir(args).path, args.format, output_dir=args.output, base=args.base,
                        outtype=args.outtype)
    print(json.dumps(result, indent=2))
    return 0


# --- the parser -----------------------------------------------------------------------------------------------

def _add_config(p, *, run_dir_help: str = "the run directory (default: runs/<the config's name>)",
                default_help: str = "default: tiny") -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--preset", help=f"a shipped preset ({default_help})")
    source.add_argument("--config", help="a run file (TOML)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a run-file setting, e.g. --set training.max_steps=20 (repeatable)")
    p.add_argument("--run-dir", help=run_dir_help)


def parser() -> argparse.ArgumentParser:
    from vlrl.config import EXPORT_FORMATS
    from vlrl.export.gguf import GGUF_TYPES

    p = argparse.ArgumentParser(prog="vlrl", description="GSPO for vision-language models on one GPU.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the whole loop: load, baseline eval, GSPO train, re-eval, export")
    _add_config(r)
    r.set_defaults(func=cmd_run)
    t = sub.add_parser("train", help="GSPO training alone: load the model and data, train, save the adapter")
    _add_config(t, default_help="default: tiny, or the run's own config.toml with --resume")
    t.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint in the run directory (optimizer, scheduler, RNG state)")
    t.set_defaults(func=cmd_train)
    s = sub.add_parser("sft", help="supervised warm start (full fine-tuning on worked answers) before RL")
    _add_config(s, run_dir_help="the run directory; the checkpoint goes to RUN_DIR/sft (default: runs/<name>)")
    s.add_argument("--steps", type=int, help="optimizer steps (default: [model] warm_start_steps, else 150)")
    s.add_argument("--learning-rate", type=float, help="peak learning rate (default: 3e-3, 1e-3 for tiny-small)")
    s.add_argument("--batch-size", type=int, default=16, help="items per step (default: 16)")
    s.set_defaults(func=cmd_sft)
    v = sub.add_parser("validate", help="check a run file or preset without loading anything; lists every problem")
    v.add_argument("target", help="a run file (TOML) or a preset name")
    v.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="check with this override applied")
    v.add_argument("--processes", type=int, help="check for a launch of this many processes (default: this one's)")
    v.set_defaults(func=cmd_validate)
    c = sub.add_parser("compare", help="before/after statistics from two eval record files")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--output", help="write the comparison JSON here (and print a summary)")
    c.set_defaults(func=cmd_compare)
    d = sub.add_parser("data", help="inspect data sources").add_subparsers(dest="data_command", required=True)
    i = d.add_parser("inspect", help="a source's DataReport and prompts, or (--config/--preset) a run's exact items")
    i.add_argument("source", nargs="?", help="a hub id, a local directory or file, or 'synthetic'")
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
    e.set_defaults(func=cmd_eval)
    rp = sub.add_parser("report", help="plots and a self-contained report.html for a run directory")
    _add_config(rp, run_dir_help="the run directory (default: runs/<name> of --config/--preset)",
                default_help="names runs/<its name>")
    rp.set_defaults(func=cmd_report)
    s = sub.add_parser("serve-rewards", help="the browser reward calculator on localhost (rewards/, offline)")
    s.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (0 picks a free one)")
    s.add_argument("--run-dir", help="a run directory whose eval_before/after.jsonl the page loads")
    s.add_argument("--page-dir", help="the folder holding index.html (default: the checkout's rewards/)")
    s.add_argument("--pyodide", help="the Pyodide runtime folder (default: rewards/node_modules/pyodide)")
    s.set_defaults(func=cmd_serve_rewards)
    env_set = {"action": "append", "metavar": "KEY=VALUE", "help": "an environment option, e.g. size=128 (repeatable)"}
    se = sub.add_parser("serve-env", help="serve an environment on 127.0.0.1 as an OpenEnv-compatible server "
                                          "(HTTP sessions and OpenEnv's WebSocket; ENVIRONMENT_API_KEY; vlrl.envs.server)")
    se.add_argument("name", help="an environment name (crafter, grid, gymnasium:ID, ...)")
    se.add_argument("--port", type=int, default=8766, help="TCP port (0 picks a free one)")
    se.add_argument("--max-sessions", type=int, default=64, help="episodes open at once (default 64)")
    se.add_argument("--max-steps", type=int, default=100_000, help="steps of one episode (default 100,000)")
    se.add_argument("--idle-s", type=float, default=600.0, help="seconds before an idle session expires (default 600)")
    se.add_argument("--set", **env_set)
    se.set_defaults(func=cmd_serve_env)
    ep = sub.add_parser("env", help="environments without a model").add_subparsers(dest="env_command", required=True)
    pl = ep.add_parser("play", help="play an episode with a model-free policy: frames, episode.jsonl, filmstrip")
    pl.add_argument("name", help="an environment name, or a `vlrl serve-env` URL (http://127.0.0.1:PORT)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--policy", choices=["random", "noop"], default="random")
    pl.add_argument("--steps", type=int, default=20, help="turns at most (default 20)")
    pl.add_argument("--output", default="play", help="the folder for the files (default: play/)")
    pl.add_argument("--set", **env_set)
    pl.set_defaults(func=cmd_env_play)
    x = sub.add_parser("export", help="export a run's adapter (lora), a merged checkpoint or GGUF files, verified")
    _add_config(x, run_dir_help="the run directory (default: runs/<name> of --config/--preset)",
                default_help="names runs/<its name>")
    x.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    x.add_argument("--output", help="where the export goes (default: RUN_DIR/adapter, merged16, merged4 or gguf)")
    x.add_argument("--base", help="the base checkpoint (default: the adapter's); give the 16-bit model when the "
                   "adapter was trained on a 4-bit one")
    x.add_argument("--outtype", default="f16", choices=GGUF_TYPES, help="GGUF weight type")
    x.set_defaults(func=cmd_export)
    return p


LAUNCHED = ("run", "train", "eval", "validate")  # the commands that run under accelerate launch (docs/multi-gpu.md)


def _one_process_only(command: str) -> None:
    from vlrl.distributed import world_size
    from vlrl.errors import ConfigError

    if command not in LAUNCHED and world_size() > 1:
        raise ConfigError(f"vlrl {command} runs in one process, and this launch has {world_size()}; run it without "
                          f"accelerate launch (only {', '.join(LAUNCHED)} use several processes).")


def main(argv: list[str] | None = None) -> int:
    from vlrl.errors import VlrlError

    args = parser().parse_args(argv)
    try:
        _one_process_only(args.command)
        return args.func(args)
    except VlrlError as err:
        print(f"vlrl {args.command}: {err}", file=sys.stderr)
        return 1
    except FileNotFoundError as err:
        print(f"vlrl {args.command}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"vlrl {args.command}: interrupted; what was written stays (records, checkpoints): run the same command "
              "again to continue.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
