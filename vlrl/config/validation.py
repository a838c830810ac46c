"""Validation of a run configuration: every problem of values and combinations, one line each, before any model
loads. `vlrl.config.runfile` calls it on every file it reads; `vlrl validate` shows it.
"""

from __future__ import annotations

import math
import re

from vlrl.base.distributed import sharded_launch, world_size
from vlrl.base.errors import ConfigError
from vlrl.config.sections import (
    BACKENDS,
    COLUMNS,
    CORRECTIONS,
    DECODE_FORMATS,
    EXPORT_FORMATS,
    LOADERS,
    LOCAL_MODELS,
    LORA_TARGETS,
    OPTIMIZERS,
    PASS_LOSS_TYPES,
    REWARDS,
    TRACKERS,
    WARM_START_PLAYERS,
    RunConfig,
    TrainingConfig,
    did_you_mean,
)
from vlrl.model import memory_cap, pixel_budget

MIN_ANSWER_TOKENS = 16  # after a thinking budget: </think>, "\n\n" and the shortest tagged answer


def validate(config: RunConfig, *, num_processes: int | None = None) -> None:
    """Raises one ConfigError listing every problem of `config` (see `problems_of`); returns None when it is sound."""
    problems = problems_of(config, num_processes=num_processes)
    if problems:
        raise ConfigError(problems)


def problems_of(config: RunConfig, *, num_processes: int | None = None) -> list[str]:
    """Every problem of values and combinations, one line each with the rule, the values and the fix.

    Nothing here loads a model or touches the network, so a run file for a hub model validates offline.
    `num_processes` (default: this launch's, `vlrl.base.distributed.world_size()`) enters the batch rules.
    """
    from vlrl.base.synthetic import KNOWN_TASKS, VIDEO_TASKS
    from vlrl.config.recipe import RECIPES, WARMUP_STEPS, WEIGHT_DECAY

    processes = num_processes or world_size()
    t, m, d, e = config.training, config.model, config.data, config.eval
    problems = []
    add = problems.append
    if not re.fullmatch(r"[A-Za-z0-9._-]+", config.name):
        add(f"name = {config.name!r} names the run directory (runs/<name>); use letters, digits, '.', '_' or '-' "
            "only, e.g. name = \"my-run\".")
    positive = [("training", "per_device_train_batch_size", t.per_device_train_batch_size),
                ("training", "gradient_accumulation_steps", t.gradient_accumulation_steps),
                ("training", "max_completion_length", t.max_completion_length),
                ("training", "logging_steps", t.logging_steps), ("training", "save_steps", t.save_steps),
                ("eval", "batch_size", e.batch_size), ("eval", "max_new_tokens", e.max_new_tokens),
                ("data", "max_prompt_tokens", d.max_prompt_tokens), ("data", "num_items", d.num_items),
                ("model", "lora_r", m.lora_r), ("model", "lora_alpha", m.lora_alpha),
                ("model", "max_seq_length", m.max_seq_length)]
    for section, key, value in positive:
        if value <= 0:
            add(f"[{section}] {key} = {value} must be positive; set it to a number above 0.")
    for section, key, value in [("model", "warm_start_steps", m.warm_start_steps),
                                ("model", "warm_start_items", m.warm_start_items), ("data", "seed", d.seed),
                                ("training", "seed", t.seed),
                                ("training", "generation_batch_size", t.generation_batch_size),
                                ("eval", "samples", e.samples), ("eval", "seed", e.seed),
                                ("training", "thinking_budget", t.thinking_budget),
                                ("eval", "thinking_budget", e.thinking_budget)]:
        if value < 0:
            add(f"[{section}] {key} = {value} must be 0 or more.")
    if not m.name_or_path.strip():
        add('[model] name_or_path is empty; give a hub id (e.g. "unsloth/Qwen3-VL-8B-Instruct-unsloth-bnb-4bit"), '
            'a local checkpoint directory, or "tiny".')
    if m.decode_format not in DECODE_FORMATS:
        add(f"[model] decode_format = {m.decode_format!r} is unknown; choose one of {', '.join(DECODE_FORMATS)}."
            f"{did_you_mean(m.decode_format, DECODE_FORMATS)}")
    elif m.decode_format in ("int8", "fp8") and (not m.load_in_4bit or m.backend == "unsloth"):
        add(f"[model] decode_format = {m.decode_format!r} repacks a 4-bit base on the transformers backend; this run "
            f"loads {'a 4-bit base on Unsloth' if m.load_in_4bit else 'its weights unquantized'}. Set "
            'decode_format = "auto".')
    if memory_cap.cap_problem(m.memory_cap_gib):
        add(memory_cap.cap_problem(m.memory_cap_gib))
    if m.backend not in BACKENDS:
        add(f"[model] backend = {m.backend!r} is unknown; choose one of {', '.join(BACKENDS)}."
            f"{did_you_mean(m.backend, BACKENDS)}")
    if m.backend == "unsloth" and processes > 1:
        add(f'[model] backend = "unsloth" runs in one process, and this launch has {processes}: Unsloth patches '
            'the trainer for one GPU. Use backend = "transformers" (or "auto") under accelerate launch '
            "(docs/multi-gpu.md), or launch one process.")
    if config.env.name and sharded_launch() and processes > 1:
        add(f"[env] name = {config.env.name!r} under {sharded_launch()}: each process plays its own episodes, so the "
            "processes decode different numbers of turns, and under sharded weights every forward waits for all of "
            "them. Launch episode runs with DDP (vlrl/accelerate_configs/ddp.yaml), one model per GPU.")
    if config.env.name and m.backend == "unsloth":
        add(f'[model] backend = "unsloth" with [env] name = {config.env.name!r}: episode runs train through vlrl\'s '
            "GRPOTrainer, whose loss Unsloth's patched trainer replaces. Use backend = \"transformers\" (or \"auto\").")
    if m.load_in_4bit and sharded_launch():
        add(f"[model] load_in_4bit = true under {sharded_launch()}, which shards 16-bit weights: vlrl's 4-bit loading "
            "is for one GPU and DDP. Set load_in_4bit = false, or launch with DDP if the 4-bit model fits one GPU "
            "(docs/multi-gpu.md).")
    if not 0 <= m.lora_dropout < 1:
        add(f"[model] lora_dropout = {m.lora_dropout} must be in [0, 1); 0 is the recipe's value.")
    for key in ("warm_start_steps", "warm_start_items", "warm_start_tasks", "warm_start_difficulty"):
        if getattr(m, key) and m.name_or_path not in LOCAL_MODELS:
            # the model first: a mistyped name (--set model.name_or_path=tinyy on a preset with a warm start) is
            # more likely than a warm start asked for a checkpoint
            off = "[]" if key == "warm_start_tasks" else "0"
            add(f"[model] name_or_path = {m.name_or_path!r} is not a model vlrl builds ({', '.join(LOCAL_MODELS)}),"
                f" and {key} = {getattr(m, key)} only applies to those: for another checkpoint set {key} = {off} "
                f"(`vlrl sft` warm-starts one first if it needs it).{did_you_mean(m.name_or_path, LOCAL_MODELS)}")
            break
    problems += _warm_start_item_problems(config)
    if m.warm_start_player not in WARM_START_PLAYERS:
        add(f"[model] warm_start_player = {m.warm_start_player!r} is unknown; choose one of "
            f"{', '.join(WARM_START_PLAYERS)}.{did_you_mean(m.warm_start_player, WARM_START_PLAYERS)}")
    elif WARM_START_PLAYERS[m.warm_start_player] not in ("", config.env.name):
        add(f"[model] warm_start_player = {m.warm_start_player!r} plays {WARM_START_PLAYERS[m.warm_start_player]!r}, "
            f"and this run's [env] name is {config.env.name!r}; use warm_start_player = \"random\" or that "
            "environment.")
    elif m.warm_start_player != "random" and not m.warm_start_steps:
        add(f"[model] warm_start_player = {m.warm_start_player!r} needs a warm start: set warm_start_steps above 0.")
    problems += _batch_problems(t, processes, episodes=bool(config.env.name))
    for section, key, value, choices in (("model", "lora_targets", m.lora_targets, LORA_TARGETS),
                                         ("training", "optim", t.optim, OPTIMIZERS),
                                         ("training", "recipe", t.recipe, RECIPES),
                                         ("training", "importance_sampling_correction",
                                          t.importance_sampling_correction, CORRECTIONS)):
        if value not in choices:
            add(f"[{section}] {key} = {value!r} is unknown; choose one of {', '.join(map(repr, choices))}."
                f"{did_you_mean(value, choices)}")
    if t.dynamic_sampling < 0:
        add(f"[training] dynamic_sampling = {t.dynamic_sampling} must be 0 (off) or the most extra draws a step.")
    elif t.dynamic_sampling:
        local = t.generation_batch_size if t.generation_batch_size and not config.env.name else \
            t.per_device_train_batch_size * t.gradient_accumulation_steps
        if t.num_generations > 0 and local % t.num_generations:
            add(f"[training] dynamic_sampling replaces whole groups within each process, and a process's share of a "
                f"step ({local} rollouts) is not whole groups of num_generations = {t.num_generations}; make it a "
                "multiple (per_device_train_batch_size x gradient_accumulation_steps, or generation_batch_size).")
        if m.backend == "unsloth":
            add('[training] dynamic_sampling needs the transformers backend: Unsloth patches the rollout it redraws.')
        if RECIPES.get(t.recipe, {}).get("scale_rewards") == "batch":
            add("[training] dynamic_sampling keeps each group's own advantages, which a batch-scaled recipe cannot.")
    if t.pass_tokens < 0:
        add(f"[training] pass_tokens = {t.pass_tokens} must be 0 (off) or the most tokens of a training pass.")
    elif t.pass_tokens and m.backend == "unsloth":
        add("[training] pass_tokens needs the transformers backend: Unsloth's patched trainer computes the loss itself.")
    elif t.pass_tokens and RECIPES.get(t.recipe, {}).get("loss_type") not in (None, *PASS_LOSS_TYPES):
        add(f"[training] pass_tokens merges micro-batches, and recipe {t.recipe!r}'s loss normalizes each micro-batch "
            f"by its own tokens, which merging changes; set pass_tokens = 0.")
    decay = WEIGHT_DECAY if t.weight_decay == -1 else t.weight_decay
    if t.weight_decay != -1 and not 0 <= t.weight_decay < 1:
        add(f"[training] weight_decay = {t.weight_decay} must be in [0, 1), or -1 for the recipe's ({WEIGHT_DECAY}).")
    elif t.optim == "sgd" and t.learning_rate * decay >= 0.5:
        add(f"[training] optim = \"sgd\" at learning_rate {t.learning_rate} with weight_decay {decay}"
            f"{' (the recipe' + chr(39) + 's)' if t.weight_decay == -1 else ''} shrinks every trained weight by "
            f"{min(1.0, t.learning_rate * decay):.0%} a step; set [training] weight_decay = 0 (or a value whose "
            "product with the learning rate is small).")
    if t.warmup_steps != -1 and (t.warmup_steps < 0 or t.warmup_steps >= 1 and t.warmup_steps != int(t.warmup_steps)):
        add(f"[training] warmup_steps = {t.warmup_steps} must be a share of the steps in [0, 1), a whole number of "
            f"steps, or -1 for the recipe's ({WARMUP_STEPS}).")
    top = 100 if t.optim == "sgd" else 1  # SGD's step is the learning rate times the (clipped) gradient
    if not 0 < t.learning_rate < top:
        add(f"[training] learning_rate = {t.learning_rate} must be in (0, {top}); the recipe uses 5e-6.")
    if t.reward not in REWARDS:
        add(f"[training] reward = {t.reward!r} is unknown; choose \"mathvista\" (MathVista's string and number "
            f"rules) or \"symbolic\" (also equivalent expressions, for geo3k).{did_you_mean(t.reward, REWARDS)}")
    if not 0 < t.temperature < 10:
        add(f"[training] temperature = {t.temperature} must be in (0, 10): 0 samples identical completions (no "
            "group to compare) and Unsloth refuses 10 or more; the recipe uses 1.0.")
    if t.max_steps == 0 or t.max_steps < -1:
        add(f"[training] max_steps = {t.max_steps}: use -1 to train num_train_epochs, or a positive number of "
            "optimizer steps.")
    if t.max_steps == -1 and t.num_train_epochs <= 0:
        add(f"[training] num_train_epochs = {t.num_train_epochs} must be positive when max_steps = -1; set "
            "num_train_epochs = 1 or a positive max_steps.")
    if not 0 < e.temperature < 10:
        add(f"[eval] temperature = {e.temperature} must be in (0, 10); it samples the draws of [eval] samples "
            "(1.0: the policy itself, as in training).")
    problems += _correction_problems(config)
    if not 0 <= t.stop_on_degeneration <= 1:
        add(f"[training] stop_on_degeneration = {t.stop_on_degeneration} is a share of completions: use 0 (never "
            "stop) or a value in (0, 1], e.g. 0.5.")
    if e.source and d.hold_out:
        add(f"[data] hold_out = {d.hold_out} must be 0 with [eval] source = {e.source!r}: the evals score every item "
            "of [eval] source and [data] trains on all of its own; set hold_out = 0, or remove [eval] source.")
    elif not e.source and d.hold_out < 1:
        add(f"[data] hold_out = {d.hold_out} must be at least 1: the before/after eval needs items (or set "
            "[eval] source to evaluate on another data set).")
    if e.source and (e.source == "synthetic" or not e.split):
        add(f"[eval] source = {e.source!r} with split = {e.split!r}: name a data set (hub id or directory) and its "
            'split, e.g. source = "AI4Math/MathVista" and split = "testmini"; generated items are held out of [data].')
    elif e.source and (e.source, e.split) == (d.source, d.split):
        add(f"[eval] source and split name [data]'s own ({e.source} {e.split}): nothing would be left to train on; "
            "remove [eval] source and hold items out with [data] hold_out instead.")
    elif e.split and not e.source:
        add(f'[eval] split = {e.split!r} needs an [eval] source; set source (e.g. "AI4Math/MathVista") or remove split.')
    if d.loader not in LOADERS:
        add(f"[data] loader = {d.loader!r} is unknown; choose one of {', '.join(map(repr, LOADERS))} (\"generic\" "
            f"for your own data, docs/data.md).{did_you_mean(d.loader, LOADERS)}")
    elif (d.loader == "synthetic") != (d.source == "synthetic") and d.loader != "auto":
        add(f"[data] loader = {d.loader!r} does not read source = {d.source!r}; generated items are "
            'source = "synthetic" (loader "auto"), a data set any other loader.')
    for key, column in d.columns.items():
        if key not in COLUMNS:
            add(f"[data] columns names {key!r}, which vlrl does not read; name the columns holding "
                f"{', '.join(COLUMNS)}.{did_you_mean(key, COLUMNS)}")
        elif not isinstance(column, str) or not column:
            add(f"[data] columns.{key} = {column!r} must be a column name (a string).")
    if d.image_size < 32 and not (d.image_size == 0 and d.source != "synthetic"):
        add(f"[data] image_size = {d.image_size} is smaller than one merged Qwen-VL patch (32 px); use 32 or more "
            "(64 for the tiny preset, 512 for real models)"
            + ("; generated items need a size." if d.image_size == 0 else ", or 0 to keep a data set's own sizes."))
    if d.max_images < 1:
        add(f"[data] max_images = {d.max_images} must be at least 1 (pictures kept per item; the rest are dropped "
            "and counted).")
    budget = pixel_budget.budget_problem(d.min_pixels, d.max_pixels)
    if budget:
        add(budget)
    for problem in video_problems(d.video_fps, d.max_frames, d.video_max_pixels):
        add(problem)
    if d.source == "synthetic":
        if 1 <= d.hold_out and d.hold_out >= d.num_items:
            add(f"[data] hold_out = {d.hold_out} must be smaller than num_items = {d.num_items}, or nothing is "
                "left to train on; raise num_items or lower hold_out.")
        if d.difficulty not in (1, 2, 3):
            add(f"[data] difficulty = {d.difficulty} must be 1, 2 or 3.")
        clips = [task for task in d.tasks if task in VIDEO_TASKS]
        if clips and len(clips) < len(d.tasks):
            add(f"[data] tasks mixes video tasks ({', '.join(clips)}) with picture tasks; an item trains on a clip or "
                "on pictures, and a batch on one kind: give one kind per run.")
        for task in d.tasks:
            if task not in KNOWN_TASKS:
                add(f"[data] tasks names {task!r}, which vlrl.base.synthetic does not generate; choose from "
                    f"{', '.join(KNOWN_TASKS)}.{did_you_mean(task, KNOWN_TASKS)}")
    single_turn = ((t.max_completion_length, "[training] max_completion_length"),
                   (e.max_new_tokens, "[eval] max_new_tokens"))
    for budget, name in () if config.env.name else single_turn:  # an episode run has no [data] prompts
        if m.max_seq_length < d.max_prompt_tokens + budget:
            add(f"[model] max_seq_length = {m.max_seq_length} is shorter than [data] max_prompt_tokens "
                f"({d.max_prompt_tokens}) + {name} ({budget}); raise max_seq_length to at least "
                f"{d.max_prompt_tokens + budget} or lower {name.split()[-1]}.")
    problems += _thinking_problems(config)
    problems += _tracker_problems(t.report_to)
    problems += _env_problems(config)
    unknown = [f for f in config.export.formats if f not in EXPORT_FORMATS]
    if unknown:
        add(f"[export] formats = {config.export.formats} has unknown {unknown}; use any of "
            f"{', '.join(EXPORT_FORMATS)}.")
    return problems


def video_problems(video_fps: float, max_frames: int, video_max_pixels: int) -> list[str]:
    """What is wrong with the video settings of `[data]` (or `vlrl data inspect`'s flags of the same names), a line
    each."""
    found = []
    if not video_fps > 0:
        found.append(f"[data] video_fps = {video_fps} must be more than 0 (frames kept per second of a video, e.g. 2).")
    if max_frames < 0 or max_frames == 1:
        found.append(f"[data] max_frames = {max_frames} must be 0 (no cap) or at least 2 (a clip's frames go to the "
                     "model in pairs).")
    budget = pixel_budget.video_budget_problem(video_max_pixels)
    return found + ([budget] if budget else [])


def _correction_problems(config: RunConfig) -> list[str]:
    """[training] importance_sampling_correction's cap, and the runs a correction applies to (vlrl.training.mismatch)."""
    t, problems = config.training, []  # an unknown mode is reported with the other unknown choices
    if not 1 <= t.importance_sampling_cap < math.inf:
        problems.append(f"[training] importance_sampling_cap = {t.importance_sampling_cap} must be a finite number of "
                        "at least 1: a cap below 1 also shrinks the tokens generation and training agree on (ratio 1); "
                        "2 is RLinf's starting point.")
    if t.importance_sampling_correction in ("token", "sequence"):
        if config.model.backend == "unsloth":
            problems.append(f"[training] importance_sampling_correction = {t.importance_sampling_correction!r} needs the "
                            'transformers backend: Unsloth computes its own loss. Set [model] backend = "auto", or '
                            'importance_sampling_correction = "off".')
        if config.env.name:
            # Not a missing piece: the episode trainer gives TRL's batch each turn's sampling log-probs, so the
            # mixin's correction would act on them; what is missing is the measurement that it helps there.
            problems.append(f"[training] importance_sampling_correction = {t.importance_sampling_correction!r} is not "
                            f"offered for episode runs ([env] name = {config.env.name!r}) until it is measured on "
                            "them: their mismatch is logged every step (sampling/rollout_train_kl), but no GPU run "
                            "has measured it at a real shape (the 2B Crafter preset, whose turns now decode on the "
                            'int8-repacked base). Set importance_sampling_correction = "off" and read the logged '
                            "mismatch.")
    return problems


def _env_problems(config: RunConfig) -> list[str]:
    """[env]: an episode run's environment, its options (`vlrl.envs.option_problems`, the check `make` runs), caps
    and seeds (nothing is built or contacted: a URL validates offline)."""
    from vlrl.envs import ENVIRONMENTS, PREFIXES, env_options, option_problems

    v = config.env
    if not v.name:
        return []
    problems = []
    add = problems.append
    prefixed = any(v.name.startswith(p) and len(v.name) > len(p) for p in PREFIXES)
    if v.name not in ENVIRONMENTS and not prefixed and not v.name.startswith(("http://", "https://")):
        add(f"[env] name = {v.name!r} is no environment; choose one of {', '.join(ENVIRONMENTS)}, gymnasium:ID (a "
            "Gymnasium environment), openenv:URL (an OpenEnv server), the URL of a `vlrl serve-env` server "
            f"(http://127.0.0.1:PORT), or \"\" for a single-turn run.{did_you_mean(v.name, ENVIRONMENTS)}")
    elif v.name.startswith("openenv:") and not v.name[len("openenv:"):].startswith(("http://", "https://")):
        add(f"[env] name = {v.name!r}: openenv: takes the server's address, e.g. \"openenv:http://127.0.0.1:8000\".")
    else:
        problems += [f"[env] options: {line}" for line in option_problems(v.name, env_options(v))]
    if v.actions and not v.name.startswith("gymnasium:"):
        add(f"[env] actions = {v.actions!r} names a Gymnasium environment's actions; {v.name!r} names its own. "
            "Remove it, or use name = \"gymnasium:ID\".")
    for key in ("max_turns", "train_seeds", "eval_seeds", "updates_per_rollout"):
        if getattr(v, key) < 1:
            add(f"[env] {key} = {getattr(v, key)} must be at least 1.")
    for key in ("train_seeds", "eval_seeds"):
        if getattr(v, key) >= 1_000_000:
            add(f"[env] {key} = {getattr(v, key)} must stay under 1,000,000 so the seed ranges of training, eval and "
                "warm start stay disjoint.")
    for key in ("max_images_per_message", "max_images_in_context"):
        if getattr(v, key) < 0:
            add(f"[env] {key} = {getattr(v, key)} must be 0 or more (0: no images).")
    if not 1 <= v.image_drop_step <= max(1, v.max_images_in_context):
        add(f"[env] image_drop_step = {v.image_drop_step} must be between 1 and max_images_in_context "
            f"({v.max_images_in_context}): over the cap, a context drops that many of its oldest images at a time.")
    if not v.text and (v.max_images_per_message == 0 or v.max_images_in_context == 0):
        add("[env] text = false with an image cap of 0 shows the model nothing; allow an image or set text = true.")
    if v.image_size and v.image_size < 32:
        add(f"[env] image_size = {v.image_size} is smaller than one merged Qwen-VL patch (32 px); use 0 (as the "
            "environment draws) or 32 or more.")
    if not 0 <= v.eval_temperature < 10:
        add(f"[env] eval_temperature = {v.eval_temperature} must be in [0, 10); 0 is greedy.")
    if config.training.max_completion_length + 64 > config.model.max_seq_length:
        add(f"[model] max_seq_length = {config.model.max_seq_length} leaves no room for an episode's context after "
            f"[training] max_completion_length ({config.training.max_completion_length}) per turn; raise it.")
    return problems


def _warm_start_item_problems(config: RunConfig) -> list[str]:
    """[model] warm_start_tasks / warm_start_difficulty: generated tasks and a difficulty, for a warm start of items."""
    from vlrl.base.synthetic import KNOWN_TASKS

    m, problems = config.model, []
    for task in m.warm_start_tasks:
        if task not in KNOWN_TASKS:
            problems.append(f"[model] warm_start_tasks names {task!r}, which vlrl.base.synthetic does not generate; "
                            f"choose from {', '.join(KNOWN_TASKS)}.{did_you_mean(task, KNOWN_TASKS)}")
    if m.warm_start_difficulty not in (0, 1, 2, 3):
        problems.append(f"[model] warm_start_difficulty = {m.warm_start_difficulty} must be 1, 2 or 3 (0: the run's "
                        "[data] difficulty).")
    asked = [key for key in ("warm_start_tasks", "warm_start_difficulty") if getattr(m, key)]
    if asked and config.env.name:
        problems.append(f"[model] {asked[0]} sets the generated items a warm start trains on, and this run's warm "
                        f"start plays [env] name = {config.env.name!r} instead; leave {asked[0]} out.")
    elif asked and not m.warm_start_steps and m.name_or_path in LOCAL_MODELS:  # another model: one line above says it
        problems.append(f"[model] {asked[0]} needs a warm start: set warm_start_steps above 0.")
    return problems


def _thinking_problems(config: RunConfig) -> list[str]:
    """A thinking budget leaves room in the completion for the forced `</think>` and an answer, in a single-turn run."""
    t, e = config.training, config.eval
    problems = []
    for section, budget, name, length in (("training", t.thinking_budget, "max_completion_length",
                                           t.max_completion_length),
                                          ("eval", e.thinking_budget, "max_new_tokens", e.max_new_tokens)):
        if budget > 0 and length - budget < MIN_ANSWER_TOKENS:
            problems.append(
                f"[{section}] {name} = {length} leaves {length - budget} tokens after thinking_budget = {budget}; the "
                f"forced </think> and the answer need at least {MIN_ANSWER_TOKENS}. Raise {name} to "
                f"{budget + MIN_ANSWER_TOKENS} or more (the answer's reasoning and solution blocks usually need "
                "hundreds), or lower thinking_budget.")
        if budget > 0 and config.env.name:
            problems.append(f"[{section}] thinking_budget = {budget} applies to single-turn runs; episode runs "
                            f"([env] name = {config.env.name!r}) generate without it. Set it to 0.")
    if t.thinking_budget > 0 and config.model.backend == "unsloth":
        problems.append(f"[training] thinking_budget = {t.thinking_budget} is enforced by vlrl's decoding engine, and "
                        "Unsloth's trainer decodes its rollouts itself. Set [model] backend = \"auto\", or "
                        "thinking_budget = 0.")
    return problems


def _tracker_problems(report_to) -> list[str]:
    """Names only: whether a tracker's package is installed is checked by transformers when the run starts, so a run
    file that names one validates offline on any machine."""
    trackers = [report_to] if isinstance(report_to, str) else report_to
    if not isinstance(trackers, list) or not all(isinstance(x, str) for x in trackers):
        return [(f'[training] report_to = {report_to!r} must be a tracker name or a list of them, e.g. report_to = '
                 '"tensorboard" or ["tensorboard", "trackio"]; "none" turns tracking off.')]
    problems = [f"[training] report_to names {tracker!r}, which transformers does not report to; choose from "
                f"{', '.join(TRACKERS)}.{did_you_mean(tracker, TRACKERS)}" for tracker in trackers
                if tracker not in TRACKERS]
    if len(trackers) > 1 and {"none", "all"} & set(trackers):
        problems.append(f'[training] report_to = {report_to!r} mixes "none" or "all" with other trackers; write '
                        'report_to = "none", report_to = "all" (every installed tracker), or a list of names.')
    return problems


def _batch_problems(t: TrainingConfig, processes: int, *, episodes: bool = False) -> list[str]:
    """GSPO compares completions of one prompt: every batch TRL forms must hold whole groups of num_generations.
    An episode run's generation_batch_size is only how many episodes play at once: any size groups them whole."""
    if t.num_generations < 2:
        return [(f"[training] num_generations = {t.num_generations} must be at least 2: GSPO compares completions "
                 "of the same prompt, and one has no group to compare with.")]
    if t.per_device_train_batch_size <= 0 or t.gradient_accumulation_steps <= 0:
        return []  # reported as not positive
    problems = []
    unit = t.per_device_train_batch_size * processes  # one micro-batch across every process
    plural = "process" if processes == 1 else "processes"
    generation_batch = unit * t.gradient_accumulation_steps
    if generation_batch % t.num_generations:
        divisors = [g for g in range(2, generation_batch + 1) if generation_batch % g == 0]
        problems.append(
            f"the generation batch (per_device_train_batch_size {t.per_device_train_batch_size} x {processes} "
            f"{plural} x gradient_accumulation_steps {t.gradient_accumulation_steps} = {generation_batch}) must be a "
            f"multiple of [training] num_generations = {t.num_generations}, so every prompt's group is complete; "
            f"set num_generations to a divisor of {generation_batch} (e.g. {_nearest(divisors, t.num_generations)}) "
            "or change the batch.")
    if t.generation_batch_size and not episodes:
        if t.recipe == "gspo-paper":
            problems.append(
                f"[training] generation_batch_size = {t.generation_batch_size} cannot be combined with recipe "
                '"gspo-paper", which sets the rollout size itself (batch x accumulation, split into optimizer '
                "steps); remove one of the two.")
        # per process; TRL's is generation_batch_size x processes, which must hold whole micro-batches and groups
        step = math.lcm(t.per_device_train_batch_size, t.num_generations // math.gcd(t.num_generations, processes))
        if t.generation_batch_size % step:
            problems.append(
                f"[training] generation_batch_size = {t.generation_batch_size} (completions each process decodes at "
                f"once; x {processes} {plural} = {t.generation_batch_size * processes} in all) must be a multiple of "
                f"per_device_train_batch_size ({t.per_device_train_batch_size}), and the total a multiple of "
                f"num_generations ({t.num_generations}): e.g. {step}; 0 decodes a whole optimizer step's rollouts "
                "at once.")
    return problems


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), -v)) if values else 2


def _trl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return ""


def head_adapter_problem(model_config) -> str | None:
    """The one line for a LoRA on the output layer where the installed TRL refuses it (1.16: its loss reads
    lm_head.weight, never the adapter's forward), else None. Not a rule of the run file (a preset stays readable on
    any TRL): `vlrl validate` and the stages that load a policy ask it, before anything loads."""
    from packaging.version import Version

    installed = _trl_version()
    if "head" not in model_config.lora_targets or not installed or Version(installed) < Version("1.16"):
        return None
    return (f"[model] lora_targets = {model_config.lora_targets!r} trains a LoRA on the output layer, which the "
            f"installed TRL ({installed}) refuses: from 1.16 it computes log-probs from lm_head.weight directly. Use "
            "lora_targets = \"layers\", or TRL < 1.16 (pip install -c constraints/lowest.txt).")
