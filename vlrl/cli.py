"""The `vlrl` command: `vlrl run | train | sft | eval | compare | report | export | validate | presets | data |
serve-rewards | serve-env | env` (their arguments: `vlrl.cli_parser`).

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

A failure a user can act on (`vlrl.base.errors.VlrlError`) prints one line, `vlrl <command>: <what, which value, the
fix>`, and exits 1; an interrupt exits 130 and keeps what was written (every stage resumes).
"""

from __future__ import annotations

import json
import os
import sys

from vlrl import cli_data

# --- resolving what a command works on --------------------------------------------------------------------------

def _config(args, default_preset: str | None = "tiny"):
    """The configuration a command names: --config or --preset (with --set), else the run directory's own
    config.toml when there is one, else `default_preset`."""
    from vlrl.config import runfile as cfg
    from vlrl.config.rundir import RunDir

    overrides = getattr(args, "set", None) or ()
    if getattr(args, "config", None) or getattr(args, "preset", None):
        config = cfg.resolve(config=args.config, preset_name=args.preset, overrides=overrides)
        note = cfg.empty_file_note(args.config, config)
        if note:
            print(note, file=sys.stderr)
        return config
    if getattr(args, "run_dir", None) and RunDir(args.run_dir).config_file.exists():
        return cfg.load(RunDir(args.run_dir).config_file, overrides=overrides)
    if default_preset is None:
        from vlrl.base.errors import RunDirError

        where = f"{args.run_dir} has no config.toml" if getattr(args, "run_dir", None) else "no --run-dir was given"
        resume = "no run to resume: " if getattr(args, "resume", False) else ""
        raise RunDirError(f"{resume}{where}; name the run with --run-dir DIR (a directory `vlrl run` made), or "
                          "--config / --preset to use runs/<its name>.")
    return cfg.preset(default_preset, overrides=overrides)


def _run_dir(args, config):
    from vlrl.config.rundir import RunDir

    return RunDir.for_config(config, getattr(args, "run_dir", None))


def _named_run_dir(args):
    """The run a command reads: --run-dir, else runs/<name> of --config / --preset."""
    from vlrl.config.rundir import RunDir

    return RunDir(args.run_dir) if args.run_dir else _run_dir(args, _config(args, default_preset=None))


def _activate(config) -> None:
    """Imports Unsloth (when the run uses it) before anything imports transformers or TRL, as Unsloth requires."""
    from vlrl.base.errors import ConfigError
    from vlrl.model.loading import activate_backend

    try:
        activate_backend(config.model.backend)
    except (ValueError, ImportError) as err:
        raise ConfigError(str(err)) from None


def _single_turn(config, command: str) -> None:
    """`vlrl eval` scores single-turn items; an episode run's evals are stages of `vlrl run`."""
    if config.env.name:
        from vlrl.base.errors import ConfigError

        raise ConfigError(f"vlrl {command} runs single-turn stages, and this run file has [env] name = "
                          f"{config.env.name!r}; run the episode loop with `vlrl run` (it resumes training from its "
                          "checkpoints), or call vlrl.run_episodes' stages from Python.")


# --- the commands ---------------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    config = _config(args)
    _activate(config)
    from vlrl.base.distributed import print_main

    if config.env.name:  # an episode run: [env] names an environment
        from vlrl.run_episodes import run
    else:
        from vlrl.run import run

    run(config, _run_dir(args, config).path, log=print_main)
    return 0


def cmd_train(args) -> int:
    config = _config(args, default_preset=None if args.resume else "tiny")
    _activate(config)
    from vlrl.base.distributed import print_main
    from vlrl.run import train_only

    train_only(config, _run_dir(args, config).path, resume=args.resume, log=print_main)
    return 0


def cmd_sft(args) -> int:
    import math

    from vlrl.base.errors import ConfigError

    # checked before the model loads (and before the run's sft/ directory is made)
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps {args.steps} must be at least 1; leave it out for [model] warm_start_steps "
                          "(else 150).")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size} must be at least 1 item a step; the default is 16.")
    if args.learning_rate is not None and not (0 < args.learning_rate < math.inf):
        raise ConfigError(f"--learning-rate {args.learning_rate} must be a positive number, e.g. 3e-3 (the default); "
                          "leave it out for the default.")
    config = _config(args)
    from vlrl.training.warmstart import sft_from_config

    sft_from_config(config, _run_dir(args, config).path / "sft", steps=args.steps,
                    learning_rate=args.learning_rate, batch_size=args.batch_size)
    return 0


def cmd_presets(args) -> int:
    """One line per shipped preset: its name, model, and the data or environment it trains on."""
    from vlrl.config.runfile import preset_summaries

    rows = preset_summaries()
    name, model = (max(len(row[key]) for row in rows) for key in ("name", "model"))
    for row in rows:
        print(f"{row['name']:<{name}}  {row['model']:<{model}}  {row['trains_on']}")
    print("\nvlrl run --preset NAME; the files: vlrl/presets/NAME.toml")
    return 0


def _check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        from vlrl.base.errors import ConfigError

        raise ConfigError(f"--port {port} is not a TCP port; give one from 1 to 65535, or 0 for a free one.")


def cmd_validate(args) -> int:
    """The rules (`vlrl.config.validation`), then what is cheap to build (`vlrl.config.preflight`): one line each."""
    from vlrl.base.distributed import world_size
    from vlrl.base.errors import ConfigError
    from vlrl.config import runfile as cfg
    from vlrl.config.preflight import preflight

    named = [x for x in (args.target, args.config, args.preset) if x]
    if len(named) != 1:
        raise ConfigError("name one run file or preset: `vlrl validate my_run.toml`, or --config FILE, or --preset "
                          "NAME (`vlrl presets` lists them).")
    target = named[0]
    config = cfg.resolve(config=target if not args.preset else None, preset_name=args.preset,
                         overrides=args.set or (), num_processes=args.processes)
    checked, problems = preflight(config)
    if problems:
        raise ConfigError(problems)
    print(f"{target}: ok (run {config.name!r}, {args.processes or world_size()} process(es))")
    note = cfg.empty_file_note(None if args.preset else target, config)
    if note:
        print(f"  {note}")
    for line in checked:
        print(f"  {line}")
    return 0


def cmd_compare(args) -> int:
    """Prints the comparison's summary; the whole comparison goes to --output as JSON."""
    from vlrl.base.errors import EvalError
    from vlrl.evaluation.compare import compare, summary, with_samples
    from vlrl.evaluation.pictures import summary_lines, with_picture_checks

    if args.output and os.path.isdir(args.output):
        raise EvalError(f"--output {args.output} is a directory; give a file path, such as "
                        f"{os.path.join(args.output, 'comparison.json')}.")
    paths = [args.before, args.after, *args.runs]
    if all(os.path.isdir(path) for path in paths):  # one config under several training seeds
        return _compare_runs(paths, args)
    if args.runs:
        raise EvalError(f"give two eval record files, or run directories alone; {len(paths)} paths were given, "
                        "not all of them directories.")
    for path in paths:
        if os.path.isdir(path):
            example = os.path.join(path, "eval_before.jsonl")
            raise EvalError(f"{path} is a directory; give two eval record files, such as {example} and the "
                            "eval_after.jsonl beside it, or run directories alone to compare runs across seeds.")
        if not os.path.exists(path):
            raise EvalError(f"no record file at {path}; give two eval files such as RUN_DIR/eval_before.jsonl.")
    result = compare(args.before, args.after)  # damaged, mismatched or unpaired records raise EvalError themselves
    samples = args.samples or [os.path.join(os.path.dirname(path), name)  # a run's sampled evals beside its evals
                               for path, name in ((args.before, "samples_before.jsonl"),
                                                  (args.after, "samples_after.jsonl"))]
    for path in args.samples or ():
        if not os.path.exists(path):
            raise EvalError(f"no sampled record file at {path}; give two such as RUN_DIR/samples_before.jsonl.")
    result = with_samples(result, *samples)  # pass@k; for episodes success@k and achievements@k
    result = with_picture_checks(result, args.before, args.after)  # `vlrl eval --images` beside the after file
    print("\n".join([summary(result), *summary_lines(result)]))
    if args.output:
        with open(args.output, "w") as f:
            f.write(json.dumps(result, indent=2))
        print(f"-> {args.output}")
    else:
        print("(the whole comparison as JSON: --output comparison.json)")
    return 0


def _compare_runs(paths: list[str], args) -> int:
    """`vlrl compare RUN_DIR RUN_DIR...`: each run's before/after and the pooled result across the runs."""
    from vlrl.base.errors import EvalError
    from vlrl.evaluation import seeds

    if args.samples:
        raise EvalError("--samples pairs two sampled eval files; it does not apply to a comparison across runs.")
    result = seeds.compare_runs(paths)
    print(seeds.summary(result))
    if args.output:
        with open(args.output, "w") as f:
            f.write(json.dumps(result, indent=2))
        print(f"-> {args.output}")
    return 0


def cmd_eval(args) -> int:
    """Evaluates the run's model (or --model) with an optional adapter on the run's held-out set."""
    from vlrl.base.errors import ConfigError

    if args.samples < 0:
        raise ConfigError(f"--samples {args.samples} must be 0 (greedy) or a number of draws per item, e.g. 8.")
    config = _config(args, default_preset=None)
    _single_turn(config, "eval")
    _activate(config)
    from vlrl import run
    from vlrl.base import distributed
    from vlrl.evaluation import sharded_eval
    from vlrl.model import loading as model

    rd = _run_dir(args, config)
    if args.adapter:
        model.require_adapter(args.adapter)
    policy, processor = run.load_base(config, log=distributed.print_main, path=args.model)
    if args.adapter:
        policy = model.load_adapter(policy, args.adapter)
    policy = run.pack_base(config, policy, log=distributed.print_main)  # the weights the run's own evals decoded
    eval_ds = run.held_out(config, processor)  # the same items as the run's evals: a pure function of the config
    if args.images:  # the same items with their pictures taken away
        from vlrl.evaluation import pictures

        eval_ds = pictures.replace_pictures(eval_ds, args.images, seed=config.eval.seed, log=distributed.print_main)
    name = (("eval_adapter" if args.adapter else "eval_base") + (f"_{args.images}" if args.images else "")
            + (f"_samples{args.samples}" if args.samples else ""))
    output = args.output or rd.eval_file(name)
    e = config.eval
    records = sharded_eval.evaluate(policy, processor, eval_ds, output, batch_size=args.batch_size or e.batch_size,
                                    max_new_tokens=args.max_new_tokens or e.max_new_tokens, samples=args.samples,
                                    temperature=e.temperature if args.temperature is None else args.temperature,
                                    seed=e.seed if args.seed is None else args.seed,
                                    symbolic=config.training.reward == "symbolic",
                                    image_dir=None if args.images else rd.eval_images,  # keep the items' own pictures
                                    thinking_budget=e.thinking_budget,
                                    fast_generation=config.training.fast_generation,  # the run's own evals' path
                                    log=distributed.print_main)
    distributed.print_main(f"{len(records)} records -> {output}")
    return 0


def cmd_report(args) -> int:
    from vlrl.report import render

    render(_named_run_dir(args).path, log=print)
    return 0


def cmd_serve_rewards(args) -> int:
    _check_port(args.port)
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
    _check_port(args.port)
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


# --- what each parsed command runs ---------------------------------------------------------------------------

HANDLERS = {"run": cmd_run, "train": cmd_train, "sft": cmd_sft, "validate": cmd_validate, "presets": cmd_presets,
            "compare": cmd_compare, "data inspect": cli_data.cmd_data_inspect, "eval": cmd_eval, "report": cmd_report,
            "serve-rewards": cmd_serve_rewards, "serve-env": cmd_serve_env, "env play": cmd_env_play,
            "export": cmd_export}


def parser():
    """The `vlrl` argument parser (`vlrl.cli_parser`)."""
    from vlrl.cli_parser import parser as build

    return build()


LAUNCHED = ("run", "train", "eval", "validate")  # the commands that run under accelerate launch (docs/multi-gpu.md)


def _one_process_only(command: str) -> None:
    from vlrl.base.distributed import world_size
    from vlrl.base.errors import ConfigError

    if command not in LAUNCHED and world_size() > 1:
        raise ConfigError(f"vlrl {command} runs in one process, and this launch has {world_size()}; run it without "
                          f"accelerate launch (only {', '.join(LAUNCHED)} use several processes).")


def main(argv: list[str] | None = None) -> int:
    from vlrl.base.distributed import end

    args = parser().parse_args(argv)
    try:
        code = _handle(args)
    except BaseException:
        end()  # the process group left; the traceback is printed on the way out
        raise
    end(exit_code=code)  # under accelerate launch: the process leaves its group and exits here
    return code


def _handle(args) -> int:
    from vlrl.base.errors import VlrlError, out_of_memory

    try:
        _one_process_only(args.command)
        return HANDLERS[args.handler](args)
    except (VlrlError, FileNotFoundError, RuntimeError) as err:  # RuntimeError: torch's OutOfMemoryError alone
        line = str(err) if isinstance(err, VlrlError | FileNotFoundError) else out_of_memory(err)
        if line is None:
            raise
        print(f"vlrl {args.command}: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"vlrl {args.command}: interrupted; what was written stays (records, checkpoints): run the same command "
              "again to continue.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
