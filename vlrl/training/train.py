"""GSPO training, the one training core: TRL's GRPOTrainer (Unsloth's when that backend is active) built from a
RunConfig, trained in a run directory with checkpoints and exact resume. Single-turn runs and episode runs alike: an
episode run's trainer plays episodes for its rollouts (`vlrl.training.episode_trainer`) and is otherwise the same trainer,
with the same recipe, services and files.

`train()` logs every metric to train_log.jsonl as it goes (`vlrl.training.callbacks`), writes the resolved trainer settings to
grpo_config.json, saves a checkpoint (adapter, optimizer, scheduler and RNG state) every `save_steps`, and resumes
from the last one, so a run killed mid-way and resumed ends where an uninterrupted one does. The degeneration monitor
logs each step's share of `addCriterion`/newline-spam and clipped completions, and can stop the run
(`[training] stop_on_degeneration`). Every step also logs the mismatch between the log-probs generation sampled with
and the ones the loss trains with (`vlrl.training.mismatch`; on Unsloth `vlrl.training.unsloth_rollouts`), and on the
transformers backend `[training] importance_sampling_correction` corrects the loss for it.

    vlrl train --config run.toml --run-dir runs/mine            # load, train, save the adapter (vlrl.run)
    vlrl train --run-dir runs/mine --resume                     # continue from the last checkpoint
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from vlrl import engine
from vlrl.base import distributed
from vlrl.base.errors import ConfigError
from vlrl.config.recipe import gspo_config, machine_choices
from vlrl.config.rundir import RunDir
from vlrl.config.runfile import RunConfig
from vlrl.episodes import rollout as episode_rollout
from vlrl.grammar import rewards, thinking
from vlrl.model import lengths
from vlrl.model.loading import backend_of
from vlrl.training import (
    chunked_scoring,
    compiled_layers,
    dynamic_sampling,
    episode_trainer,
    loss,
    mismatch,
    passes,
    video_inputs,
)
from vlrl.training.callbacks import DegenerationMonitor, JsonlLogger, StepLine, quiet_progress
from vlrl.training.collapse import CollapseMonitor


def grpo_args(config: RunConfig, run: str | Path | RunDir):
    """The `trl.GRPOConfig` for a RunConfig: the recipe from `vlrl.config.recipe.gspo_config`, the run's own sizes."""

    run, t = RunDir.of(run), config.training
    extra = {}
    if config.env.name:  # an episode run: one reward (the return); generation_batch_size is episodes played at once
        extra.update(reward_weights=[1.0], num_iterations=config.env.updates_per_rollout)
    elif t.generation_batch_size:  # vlrl's is per process; TRL's counts every process's completions
        extra["generation_batch_size"] = t.generation_batch_size * distributed.world_size()
    if t.optim:  # else the recipe's AdamW
        extra["optim"] = t.optim
    if t.weight_decay >= 0:  # else the recipe's
        extra["weight_decay"] = t.weight_decay
    if t.warmup_steps >= 0:  # else the recipe's
        extra["warmup_steps"] = int(t.warmup_steps) if t.warmup_steps >= 1 else t.warmup_steps
    args = gspo_config(
        output_dir=str(run.checkpoints), recipe=t.recipe, learning_rate=t.learning_rate,
        per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps, num_generations=t.num_generations,
        max_completion_length=t.max_completion_length, num_train_epochs=t.num_train_epochs, max_steps=t.max_steps,
        temperature=t.temperature, logging_steps=t.logging_steps, save_strategy="steps", save_steps=t.save_steps,
        seed=t.seed, data_seed=t.seed, report_to=t.report_to, project="vlrl", run_name=run.path.name, **extra,
    )
    if args.device.type == "cpu" and args.device.index is not None:
        # Under several CPU processes accelerate puts process k on "cpu:k", which transformers passes to torch.load
        # when it resumes the optimizer, and torch cannot map storages to "cpu:k" (a 2-process resume failed on it).
        # One CPU is "cpu" to every process: the cached device is set so.
        import torch

        args.__dict__["_setup_devices"] = torch.device("cpu")
    return args


def build_trainer(config: RunConfig, model, processor, train_dataset, run: str | Path | RunDir, *,
                  fast_generation: bool | None = None, callbacks=(), log=print):
    """The GRPOTrainer for a RunConfig: vlrl's rewards (format watched by the degeneration monitor), the GSPO
    arguments, metrics appended to the run's train_log.jsonl, the engine's rollouts and the rollout/training mismatch
    measured every step (`vlrl.training.mismatch`; over Unsloth's trainer and loss `vlrl.training.unsloth_rollouts`),
    on the transformers backend corrected as `[training] importance_sampling_correction` says in vlrl's GSPO loss
    (`vlrl.training.loss`): TRL's trainer with vlrl's mixins, through `vlrl.training.trl_bridge`."""
    from trl import GRPOTrainer  # after load_model: with Unsloth active, this is Unsloth's patched trainer

    run, t = RunDir.of(run), config.training
    args = grpo_args(config, run)
    monitor = DegenerationMonitor(t.stop_on_degeneration, args.max_completion_length, log=log)
    collapse = CollapseMonitor(t.stop_on_collapse, log=log)
    step_line = StepLine(log=log)
    transformers_backend = backend_of(model) == "transformers"  # Unsloth patches generation and the loss itself
    if config.env.name:  # episodes for rollouts (`vlrl.training.episode_trainer`): the reward is each episode's return
        reward_funcs = [episode_trainer.episode_return]
    else:
        chosen = rewards.reward_funcs(symbolic=t.reward == "symbolic")  # [training] reward: format, correctness
        # a thinking model's rewards score its whole turn (the prompt's <think> included) and log its thinking
        reward_funcs = thinking.with_thinking([collapse.watch(monitor.watch(chosen[0])), step_line.watch(chosen[1]),
                                               *chosen[2:]], processor, t.thinking_budget)
    given = {"model": model, "reward_funcs": reward_funcs, "args": args, "train_dataset": train_dataset,
             "processing_class": processor,
             "callbacks": [monitor, collapse, step_line, JsonlLogger(run.train_log), *callbacks]}
    from vlrl.training import trl_bridge  # checks the TRL installed for what vlrl's mixins hook

    if transformers_backend:
        compiled_layers.for_run(model, t.compiled_layers)  # one CUDA GPU: the layers' training forwards compiled
        settings = {"importance_sampling_correction": t.importance_sampling_correction,
                    "importance_sampling_cap": t.importance_sampling_cap, "dynamic_sampling": t.dynamic_sampling}
        if config.env.name:
            mixins = (mismatch.RolloutMismatch, episode_trainer.EpisodeRollouts, loss.GspoLoss)
            settings.update(_episode_settings(config, model, processor, args, log), degeneration_monitor=monitor,
                            collapse_monitor=collapse)
        else:
            mixins = (passes.MergedPasses, mismatch.RolloutMismatch, dynamic_sampling.Redraws, loss.GspoLoss,
                      video_inputs.VideoInputs, chunked_scoring.ChunkedScoring)
            settings.update(pass_tokens=t.pass_tokens, watchers=(monitor, collapse, step_line),
                            rollout_decoding=rollout_decoding(config, model, processor, train_dataset, args,
                                                              fast_generation))
        trainer = trl_bridge.trainer_class(GRPOTrainer, mixins)(**given, settings=settings)
    else:
        refused = [f"{name} = {value!r}" for name, value in (("[env] name", config.env.name),
                                                            ("[training] dynamic_sampling", t.dynamic_sampling),
                                                            ("[training] pass_tokens", t.pass_tokens))
                   if value]
        if train_dataset is not None and "video" in getattr(train_dataset, "column_names", ()):
            refused.append("a video column in the training data")
        if refused:  # `vlrl validate` says so before loading; a trainer built directly is refused too
            raise ConfigError(f"{', '.join(refused)} needs the transformers backend: Unsloth's patched trainer replaces "
                              "the rollout and the loss vlrl hooks. Set [model] backend = \"transformers\".")
        from vlrl.training import unsloth_rollouts

        # Unsloth's trainer keeps its own loss; vlrl decodes the rollouts (the placeholders never sampled:
        # `vlrl.training.unsloth_rollouts` says why) and measures the mismatch beside the loss
        settings = {"importance_sampling_cap": t.importance_sampling_cap, "rollout_decoding": rollout_decoding(
            config, model, processor, train_dataset, args, fast_generation)}
        trainer = trl_bridge.trainer_class(GRPOTrainer, (unsloth_rollouts.UnslothRolloutMismatch,))(
            **given, settings=settings)
    # the monitor adds its numbers to each step's logs, so it goes first: the trackers (report_to) come before any
    # callback passed in, and would log the step without them
    trainer.callback_handler.callbacks[:0] = [trainer.pop_callback(monitor), trainer.pop_callback(collapse)]
    quiet_progress(trainer)
    _point_trackers(trainer, run, log)
    return trainer


def _episode_settings(config: RunConfig, model, processor, args, log) -> dict:
    """An episode run's rollouts: its environment, how episodes are played and decoded (their tokens' log-probs
    recorded for the mismatch metric), how many at once, and the token budget of a training forward pass."""
    play_settings = replace(episode_rollout.settings_for(config, "train"), record_logps=True)
    return {"make_env": episode_rollout.environment_for(config), "play_settings": play_settings,
            "episodes_at_once": config.training.generation_batch_size,
            "pass_tokens": config.training.pass_tokens or config.model.max_seq_length,
            "episode_log": log,
            "rollout_decoding": episode_rollout.decoding_for(model, processor, play_settings)}  # play's one


# GRPOConfig's sampling filters at the values that leave the distribution whole (TRL's defaults)
UNSAMPLED = {"top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}


def rollout_decoding(config: RunConfig, model, processor, train_dataset, args, fast_generation: bool | None = None):
    """How the trainer's rollouts decode (`vlrl.engine`): at the recipe's temperature, [training]
    max_completion_length and thinking_budget, recording each token's log-prob for the mismatch metric; with
    `fast_generation` (default: [training] fast_generation) a static KV cache sized once for the data set's longest
    prompt, so every rollout replays one compiled graph."""
    t = config.training
    fast = t.fast_generation if fast_generation is None else fast_generation
    unsupported = {k: getattr(args, k) for k, neutral in UNSAMPLED.items() if getattr(args, k, neutral) != neutral}
    if unsupported or args.generation_kwargs:
        raise ConfigError(f"vlrl's rollouts sample the whole distribution at the temperature (GSPO's ratios assume "
                          f"it); these generation settings would change it: {unsupported or args.generation_kwargs}. "
                          "Leave them at TRL's defaults.")
    decoding = engine.decoding_for(model, processor, max_new_tokens=args.max_completion_length,
                                   temperature=args.temperature, thinking_budget=t.thinking_budget, static=fast,
                                   record_logps=True)
    longest = lengths.longest_prompt(train_dataset) or config.data.max_prompt_tokens
    return replace(decoding, min_cache_length=min(longest, config.data.max_prompt_tokens) + args.max_completion_length)


def _point_trackers(trainer, run: RunDir, log) -> None:
    """TensorBoard writes into the run's tensorboard/ (unless TENSORBOARD_LOGGING_DIR says otherwise); says where each
    tracker's files go. trackio keeps its own store: TRACKIO_DIR, read once when trackio is imported (TRL does that)."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback) and callback.logging_dir is None:
            callback.logging_dir = str(run.tensorboard)
            log(f"tensorboard: {callback.logging_dir} (tensorboard --logdir {callback.logging_dir})")
    if "trackio" in trainer.args.report_to:
        import trackio

        store, project = trackio.utils.TRACKIO_DIR, trainer.args.project
        log(f"trackio: project {project}, run {trainer.args.run_name}, in {store} "
            f"(TRACKIO_DIR={store} trackio show --project {project})")


def train(config: RunConfig, model, processor, train_dataset, run_dir: str | Path | RunDir, *, resume: bool = False,
          log=print):
    """GSPO-trains the (LoRA-wrapped) model on `train_dataset` (TRL prompt rows) in a run directory; returns the
    trainer. Saving the adapter is the caller's (`vlrl.run`), so a notebook can look before it exports.

    Args:
        config: the validated RunConfig.
        model, processor: from `vlrl.run.load_policy` (or `vlrl.model.loading.load_model` + `add_lora`).
        train_dataset: TRL prompt rows, from `vlrl.run.prepare`.
        run_dir: the run directory. It gets config.toml, grpo_config.json, train_log.jsonl and
            checkpoints/checkpoint-<step>/.
        resume: continue from the last checkpoint in run_dir (optimizer, scheduler and RNG state included); the
            run's configuration must be the one it started with. Without a checkpoint it starts from step 0.
            Without `resume`, old checkpoints and train_log.jsonl in run_dir are removed first.

    Returns:
        The trainer; None when `resume` finds training done (its last checkpoint at the last step): then nothing is
        trained or written, and `model` holds that checkpoint's adapter weights.
    """
    run = RunDir.of(run_dir)
    run.start(config, action="resume training" if resume else "train")
    last = _last_checkpoint(run.checkpoints) if resume else None
    if resume and last is None:
        log(f"resume: no checkpoint in {run.checkpoints} yet; starting from step 0")
    if last is not None and finished(last):
        _load_adapter_weights(model, last)
        log(f"{done_training(run)}; nothing to train, the policy is that checkpoint's")
        return None
    if last is not None:
        log(f"resume: continuing from {last.name}")
    distributed.on_main(_clear_for, run, last)  # a fresh start deletes checkpoints, which the others read only to resume

    trainer = build_trainer(config, model, processor, train_dataset, run, log=log)
    backend = backend_of(model)
    t = config.training
    distributed.on_main(_write_resolved_args, trainer, run.grpo_config, backend=backend, recipe=t.recipe,
                        importance_sampling_correction=t.importance_sampling_correction,
                        importance_sampling_cap=t.importance_sampling_cap, processes=distributed.world_size(),
                        rollouts="episodes" if config.env.name else "completions",
                        machine=machine_choices(t.optim))  # the optimizer and precision taken, and why
    log(f"trainer: {type(trainer).__name__} ({backend} backend), recipe {t.recipe}; resolved settings "
        f"in {run.grpo_config}")
    trainer.train(resume_from_checkpoint=str(last) if last else None)
    _back_to_before_a_collapse(trainer, model, run, log)
    return trainer


def _back_to_before_a_collapse(trainer, model, run: RunDir, log) -> None:
    """After a run `[training] stop_on_collapse` stopped: the policy goes back to the last checkpoint saved before the
    collapse began (what the run evaluates and exports after), when there is one."""
    collapse = next((c for c in trainer.callback_handler.callbacks if isinstance(c, CollapseMonitor)), None)
    if collapse is None or collapse.stopped_at_step is None:
        return
    last = _last_checkpoint(run.checkpoints, before=collapse.since_step)
    if last is None:
        log(f"collapse: no checkpoint was saved before step {collapse.since_step} ([training] save_steps = "
            f"{trainer.args.save_steps}); the policy stays the collapsed one")
        return
    _load_adapter_weights(model, last)
    log(f"collapse: the policy is {last.name}'s again, the last checkpoint before the collapse")


def _clear_for(run: RunDir, last: Path | None) -> None:
    """A fresh start removes an earlier run's checkpoints and log lines, which would mix into this one; a resumed run
    keeps its log up to the checkpoint it continues from."""
    if last is None:
        shutil.rmtree(run.checkpoints, ignore_errors=True)
        shutil.rmtree(run.tensorboard, ignore_errors=True)
        run.train_log.unlink(missing_ok=True)
    else:
        _truncate_log(run.train_log, _checkpoint_step(last))


def _write_resolved_args(trainer, path: Path, **extra) -> None:
    """The GRPOConfig values the trainer actually runs with (after Unsloth's own adjustments), and who ran it: the
    trainer's class, the processes that trained (`accelerate launch`), what a rollout was."""
    values = json.loads(trainer.args.to_json_string())
    values["vlrl"] = {**extra, "trainer_class": f"{type(trainer).__module__}.{type(trainer).__name__}",
                      "config_class": f"{type(trainer.args).__module__}.{type(trainer.args).__name__}"}
    path.write_text(json.dumps(values, indent=2, sort_keys=True))


def _checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[-1])


def _last_checkpoint(folder: Path, *, before: int | None = None) -> Path | None:
    """The checkpoint with the highest step (below `before`, when given) that was written completely
    (trainer_state.json is saved last)."""
    steps = [(_checkpoint_step(p), p) for p in folder.glob("checkpoint-*")
             if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").exists()]
    steps = [(step, p) for step, p in steps if before is None or step < before]
    return max(steps)[1] if steps else None


def done_training(run: str | Path | RunDir) -> str | None:
    """A line saying the run's training is done (its last checkpoint is its last step), else None."""
    last = _last_checkpoint(RunDir.of(run).checkpoints)
    if last is None or not finished(last):
        return None
    step, total = finished(last)
    return f"resume: training is done ({last.name}, step {step} of {total}; a new run needs a new --run-dir)"


def finished(checkpoint: Path) -> tuple[int, int] | None:
    """(step, total) when `checkpoint` is the last step of its training (trainer_state.json says so), else None."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    step, total = state.get("global_step", 0), state.get("max_steps", 0)
    return (step, total) if 0 < total <= step else None


def _load_adapter_weights(model, checkpoint: Path) -> None:
    """The checkpoint's LoRA weights into the (PEFT) model, as a resumed trainer would load them."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(checkpoint / "adapter_model.safetensors")))


def _truncate_log(path: Path, step: int) -> None:
    """Keeps the log records up to `step`, so a resumed run's log reads like an uninterrupted one."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except json.JSONDecodeError:  # a line torn by the kill
            continue
    path.write_text("".join(f"{line}\n" for line in kept))
