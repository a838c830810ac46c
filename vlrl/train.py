"""Training: GSPO with TRL's GRPOTrainer (Unsloth's when that backend is active), and the supervised warm start.

`train()` logs every metric to `train_log.jsonl` in the run directory as it goes, writes the resolved trainer
settings to `grpo_config.json`, saves a checkpoint (adapter, optimizer, scheduler and RNG state) every `save_steps`,
and resumes from the last one, so a run killed mid-way and resumed ends where an uninterrupted one does. A
degeneration monitor logs each step's share of `addCriterion`/newline-spam completions and of clipped completions,
and can stop the run (`[training] stop_on_degeneration`). `sft()` is the cold-start stage (`vlrl sft`): it teaches a
model the answer format on items whose worked answers are known (the tiny preset needs it: a random model never
writes the tags).

    vlrl train --config run.toml --output-dir runs/mine            # load, train, save the adapter
    vlrl train --output-dir runs/mine --resume                     # continue from the last checkpoint
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path

from transformers import TrainerCallback

from vlrl import answers, data, prompts, rewards


class JsonlLogger(TrainerCallback):
    """Appends each logged metrics dict (with its step) to a JSONL file, flushed at once so nothing is lost."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        record = {"step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


class DegenerationMonitor(TrainerCallback):
    """Watches every completion the trainer scores and logs, each logging step:

    - `degeneration/rate`: the share of completions that are `addCriterion`/newline spam (`rewards.format_parts`),
    - `degeneration/mean_ratio`: their mean spam share (`rewards.degeneration_ratio`),
    - `degeneration/clipped_ratio`: the share cut off at max_completion_length (TRL's `completions/clipped_ratio`,
      or counted here from the completion lengths when the trainer does not report it).

    With `stop_at` > 0 it stops training (after saving a checkpoint) once `degeneration/rate` reaches `stop_at`.
    The completions reach it through `watch(reward_func)`, a pass-through wrapper: both TRL's and Unsloth's
    trainers hand every completion to the reward functions, so this needs nothing from either trainer's internals.

    >>> monitor = DegenerationMonitor()
    >>> watched = monitor.watch(rewards.format_reward)
    >>> watched.__name__, watched(["addCriterion\\naddCriterion", "<SOLUTION>4</SOLUTION>"])
    ('format_reward', [-2.0, 1.0])
    >>> monitor.summary()
    {'degeneration/rate': 0.5, 'degeneration/mean_ratio': 0.5}
    """

    def __init__(self, stop_at: float = 0.0, max_completion_length: int | None = None, log=print):
        self.stop_at = stop_at
        self.max_completion_length = max_completion_length
        self.log = log
        self.stopped_at_step = None
        self._reset()

    def _reset(self):
        self.seen = self.degenerate = self.lengths_seen = self.clipped = 0
        self.ratio_sum = 0.0

    def observe(self, completions, completion_ids=None) -> None:
        for completion in completions:
            parts = rewards.format_parts(completion)
            self.seen += 1
            self.degenerate += bool(parts["degenerate"])
            self.ratio_sum += parts["degeneration_ratio"]
        if completion_ids is not None and self.max_completion_length:
            self.lengths_seen += len(completion_ids)
            self.clipped += sum(len(ids) >= self.max_completion_length for ids in completion_ids)

    def watch(self, reward_func):
        """`reward_func`, unchanged (same name, same scores), that also shows its completions to this monitor."""
        @functools.wraps(reward_func)
        def watched(completions, **kwargs):
            self.observe(completions, kwargs.get("completion_ids"))
            return reward_func(completions, **kwargs)

        return watched

    def summary(self) -> dict:
        if not self.seen:
            return {}
        out = {"degeneration/rate": self.degenerate / self.seen, "degeneration/mean_ratio": self.ratio_sum / self.seen}
        if self.lengths_seen:
            out["degeneration/clipped_ratio"] = self.clipped / self.lengths_seen
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or not self.seen:
            return  # nothing generated since the last log (e.g. the end-of-training summary)
        summary = self.summary()
        if "completions/clipped_ratio" in logs:  # the trainer's own count (EOS-aware) wins over the length count
            summary["degeneration/clipped_ratio"] = logs["completions/clipped_ratio"]
        logs.update(summary)
        self._reset()
        if self.stop_at and summary["degeneration/rate"] >= self.stop_at:
            logs["degeneration/early_stop"] = 1
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
            control.should_save = True  # keep the state that degenerated, for inspection
            self.log(f"stopping at step {state.global_step}: {summary['degeneration/rate']:.0%} of the completions "
                     f"degenerated (>= [training] stop_on_degeneration = {self.stop_at})")


def sft_target(item: dict) -> str:
    """The worked answer a warm start teaches: short reasoning, then the gold answer, in vlrl's tags."""
    reasoning = (item.get("metadata") or {}).get("reasoning") or "I read the figure."
    return (f"{answers.REASONING_START}{reasoning}{answers.REASONING_END}"
            f"{answers.SOLUTION_START}{item['answer']}{answers.SOLUTION_END}")


def sft(model_path: str | Path, items: list[dict], output_dir: str | Path, *, max_steps: int = 300,
        learning_rate: float = 3e-3, batch_size: int = 16, seed: int = 0, log_path: str | Path | None = None,
        log=print):
    """Supervised warm start: full fine-tuning on worked answers, loss on the completion tokens only.

    A deliberately small loop rather than TRL's SFTTrainer: it applies the 152k-row LM head only at completion
    positions and computes nothing else over the vocabulary, which makes a tiny-model step about 4x faster on CPU
    (measured 0.8 s vs 3.1-4.7 s per batch of 16) — the warm start is most of the tiny preset's first run.

    Args:
        model_path: the checkpoint to start from.
        items: canonical rows whose answers (and `metadata.reasoning`, when present) are the targets.
        output_dir: where the trained checkpoint and processor are saved.
        max_steps: optimizer steps.
        learning_rate: peak learning rate (linear warm-up, cosine decay).
        batch_size: items per step.
        seed: data order.
        log_path: optional JSONL file for the loss curve.
    """
    import random

    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm
    from transformers import AutoModelForImageTextToText, AutoProcessor, get_cosine_schedule_with_warmup

    output_dir = Path(output_dir)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).to(device)
    processor = AutoProcessor.from_pretrained(model_path)
    processor.tokenizer.padding_side = "right"
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, max_steps // 10), max_steps)
    order, rng = [], random.Random(seed)
    model.train()
    for step in tqdm(range(1, max_steps + 1), desc="warm start", unit="step"):
        if len(order) < batch_size:
            order += rng.sample(range(len(items)), len(items))
        batch = [items[order.pop()] for _ in range(batch_size)]
        inputs, labels = _sft_batch(processor, batch)
        hidden = model.model(**inputs.to(device)).last_hidden_state[:, :-1]
        targets = labels[:, 1:].to(device)
        keep = targets != -100
        logits = model.lm_head(hidden[keep])  # the LM head only where there is a target token
        loss = F.cross_entropy(logits.float(), targets[keep])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if log_path and (step % 10 == 0 or step == max_steps):
            with open(log_path, "a") as f:
                f.write(json.dumps({"step": step, "loss": loss.item(), "learning_rate": schedule.get_last_lr()[0]}) + "\n")
    model.eval()
    model.save_pretrained(str(output_dir))
    processor.tokenizer.padding_side = "left"
    processor.save_pretrained(str(output_dir))
    _copy_generation_config(model_path, output_dir)
    log(f"warm start done: final loss {loss.item():.3f}")
    return output_dir


SFT_SYNTHETIC_ITEMS = 512  # generated warm-start items (what the tiny model's cached warm start uses)


def sft_items(config) -> list[dict]:
    """The warm start's items for a RunConfig: never an item, or a picture, that the held-out eval uses.

    Generated sources get a separate, larger set (`SFT_SYNTHETIC_ITEMS`, seeds disjoint from the run's); other
    sources use the training part of the configured split.
    """
    from vlrl import run as stages
    from vlrl import synthetic

    d = config.data
    train_rows, held_out = data.split_holdout(stages.load_rows(d), d.hold_out, seed=d.seed)
    if d.source != "synthetic":
        return train_rows
    held = {data.image_hash(r["image"]) for r in held_out}
    extra = synthetic.generate(SFT_SYNTHETIC_ITEMS, seed=d.seed + 10_000, image_size=d.image_size,
                               difficulty=d.difficulty)
    return [r for r in extra if data.image_hash(r["image"]) not in held]


def sft_from_config(config, output_dir: str | Path, *, steps: int | None = None, learning_rate: float = 3e-3,
                    batch_size: int = 16, log=print) -> Path:
    """`vlrl sft`: the supervised warm start for the configured model, as a checkpoint RL can start from.

    The tiny model starts from its random weights; any other model from `[model] name_or_path`. This is full
    fine-tuning in float32 (the tiny preset's warm start), meant for small models: 4-bit weights cannot be trained.

    Returns:
        `output_dir`, loadable with `[model] name_or_path = "<output_dir>"` (and warm_start_steps = 0).
    """
    from vlrl.config import ConfigError

    m = config.model
    if m.load_in_4bit:
        raise ConfigError(f"vlrl sft fine-tunes every weight, which 4-bit weights cannot do; set [model] "
                          f"load_in_4bit = false and point name_or_path at a 16-bit checkpoint (not {m.name_or_path!r}).")
    steps = steps or m.warm_start_steps or 150
    if m.name_or_path == "tiny":
        from vlrl.tiny import ensure_tiny

        model_path = ensure_tiny(seed=config.data.seed, warm_start_steps=0, log=log)
    else:
        model_path = m.name_or_path
    items = sft_items(config)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log(f"warm start: {steps} supervised steps on {len(items)} items from {model_path} -> {output_dir}")
    sft(model_path, items, output_dir, max_steps=steps, learning_rate=learning_rate, batch_size=batch_size,
        seed=config.training.seed, log_path=output_dir / "sft_log.jsonl", log=log)
    log(f'train from it with [model] name_or_path = "{output_dir}" and warm_start_steps = 0')
    return output_dir


def _sft_batch(processor, batch: list[dict]):
    """Tokenizes prompt + worked answer; labels are -100 everywhere but the answer (and its end-of-turn token)."""
    texts_in = [processor.apply_chat_template(prompts.to_prompt(item)["prompt"], add_generation_prompt=True,
                                             tokenize=False) for item in batch]
    texts = [p + sft_target(item) + "<|im_end|>" for p, item in zip(texts_in, batch)]
    images = [item["image"] for item in batch]
    inputs = processor(text=texts, images=images, return_tensors="pt", padding=True)
    prompt_lengths = [len(ids) for ids in processor(text=texts_in, images=images)["input_ids"]]
    labels = inputs["input_ids"].clone()
    for row, length in enumerate(prompt_lengths):
        labels[row, :length] = -100
    labels[inputs["attention_mask"] == 0] = -100
    return inputs, labels


def _copy_generation_config(src, dst) -> None:
    src_file = Path(src) / "generation_config.json"
    if src_file.exists():
        (Path(dst) / "generation_config.json").write_text(src_file.read_text())


def grpo_args(config, run_dir: str | Path):
    """The `trl.GRPOConfig` for a RunConfig: the recipe from `vlrl.config.gspo_config`, the run's own sizes."""
    from vlrl.config import gspo_config

    t = config.training
    rollout = {"generation_batch_size": t.generation_batch_size} if t.generation_batch_size else {}
    return gspo_config(
        output_dir=str(Path(run_dir) / "checkpoints"), recipe=t.recipe, learning_rate=t.learning_rate,
        per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps, num_generations=t.num_generations,
        max_completion_length=t.max_completion_length, num_train_epochs=t.num_train_epochs, max_steps=t.max_steps,
        temperature=t.temperature, logging_steps=t.logging_steps, save_strategy="steps", save_steps=t.save_steps,
        seed=t.seed, data_seed=t.seed, report_to=t.report_to, project="vlrl", run_name=Path(run_dir).name, **rollout,
    )


def build_trainer(config, model, processor, train_dataset, run_dir: str | Path, *, fast_generation: bool | None = None,
                  callbacks=(), log=print):
    """The GRPOTrainer for a RunConfig: vlrl's rewards (format watched by the degeneration monitor), the GSPO
    arguments, metrics appended to run_dir/train_log.jsonl, and fast rollouts on the transformers backend."""
    from trl import GRPOTrainer  # after load_model: with Unsloth active, this is Unsloth's patched trainer

    from vlrl import model as vmodel

    run_dir = Path(run_dir)
    args = grpo_args(config, run_dir)
    monitor = DegenerationMonitor(config.training.stop_on_degeneration, args.max_completion_length, log=log)
    reward_funcs = [monitor.watch(rewards.REWARD_FUNCS[0]), *rewards.REWARD_FUNCS[1:]]
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                          processing_class=processor,
                          callbacks=[monitor, JsonlLogger(run_dir / "train_log.jsonl"), *callbacks])
    trainer.degeneration_monitor = monitor
    # the monitor adds its numbers to each step's logs, so it goes first: the trackers (report_to) come before any
    # callback passed in, and would log the step without them
    trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(monitor))
    _point_trackers(trainer, run_dir, log)
    if fast_generation is None:
        fast_generation = config.training.fast_generation
    if fast_generation and vmodel.backend_of(model) == "transformers":  # Unsloth patches generation itself
        enable_fast_generation(trainer, max_cache_len=config.data.max_prompt_tokens
                               + config.training.max_completion_length)
    return trainer


def _point_trackers(trainer, run_dir: Path, log) -> None:
    """TensorBoard writes into run_dir/tensorboard (unless TENSORBOARD_LOGGING_DIR says otherwise); says where each
    tracker's files go. trackio keeps its own store: TRACKIO_DIR, read once when trackio is imported (TRL does that)."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback) and callback.logging_dir is None:
            callback.logging_dir = str(run_dir / "tensorboard")
            log(f"tensorboard: {callback.logging_dir} (tensorboard --logdir {callback.logging_dir})")
    if "trackio" in trainer.args.report_to:
        import trackio

        store, project = trackio.utils.TRACKIO_DIR, trainer.args.project
        log(f"trackio: project {project}, run {trainer.args.run_name}, in {store} "
            f"(TRACKIO_DIR={store} trackio show --project {project})")


def enable_fast_generation(trainer, max_cache_len: int) -> None:
    """Rollouts with a static KV cache and compiled (CUDA-graph) decoding instead of TRL's eager default.

    Decoding a batch of 8 on one GPU is bound by per-token overhead (hundreds of small kernels launched from Python
    per token), not by reading the weights. A static cache of one fixed size (prompt budget + completion budget, so
    no step recompiles) lets transformers compile the decoding step and replay it as a CUDA graph. TRL builds its
    GenerationConfig with `disable_compile=True`; this turns compilation back on for the trainer's rollouts.
    bitsandbytes 4-bit layers are marked compileable here: bitsandbytes >= 0.45 registers its kernels as torch ops.
    Measured on an H200, Qwen3-VL-8B shape, 4-bit, batch 8 x 256 tokens: 18.9 -> 6.75 s per GSPO step
    (bench/results/gpu.md). No effect without CUDA.
    """
    import torch

    if not torch.cuda.is_available():
        return
    config = trainer.generation_config
    config.cache_implementation = "static"
    config.max_cache_len = max_cache_len
    config.disable_compile = False
    trainer.generation_kwargs.update(cache_implementation="static", max_cache_len=max_cache_len, disable_compile=False)
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantizer = getattr(base, "hf_quantizer", None)
    if quantizer is not None and not quantizer.is_compileable:
        # Only this model's quantizer: a subclass for the one instance, so other models in the process keep the
        # library's answer (isinstance checks still hold).
        cls = type(quantizer)
        quantizer.__class__ = type(cls.__name__, (cls,), {"is_compileable": property(lambda self: True)})


def train(config, model=None, processor=None, train_dataset=None, run_dir: str | Path | None = None, *,
          resume: bool = False, log=print):
    """GSPO-trains the (LoRA-wrapped) model on `train_dataset` (TRL prompt rows); returns the trainer.

    Given only `config`, it loads the model and the data itself, with the functions `vlrl run` uses, and saves the
    trained adapter to `run_dir/adapter` (verified from disk) when done: that is `vlrl train`. Given a model,
    processor and data set (a notebook, or `vlrl run`), it trains those and leaves saving to the caller.

    Args:
        config: the validated RunConfig.
        model, processor, train_dataset: from `vlrl.model.load_model` and `vlrl.run.prepare`; None to load them.
        run_dir: the run directory (default runs/<name>). Gets config.toml, grpo_config.json, train_log.jsonl and
            checkpoints/checkpoint-<step>/.
        resume: continue from the last checkpoint in run_dir (optimizer, scheduler and RNG state included); the
            run file must match the one the run started with. Without a checkpoint it starts from step 0.
            Without `resume`, old checkpoints and train_log.jsonl in run_dir are removed first.
    """
    from vlrl import config as cfg
    from vlrl import model as vmodel

    run_dir = Path(run_dir or Path("runs") / config.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoints, log_path = run_dir / "checkpoints", run_dir / "train_log.jsonl"
    if resume:
        _check_same_config(config, run_dir / "config.toml")
    (run_dir / "config.toml").write_text(cfg.to_toml(config))
    standalone = model is None
    if standalone:
        from vlrl import run as stages

        model, processor = stages.load_policy(config, log)
        train_dataset, _ = stages.prepare(config, processor, run_dir, log)
    elif processor is None or train_dataset is None:
        raise ValueError("train() needs the processor and train_dataset with the model, or none of the three "
                         "(then it loads them from the config).")

    last = _last_checkpoint(checkpoints) if resume else None
    if resume and last is None:
        log(f"resume: no checkpoint in {checkpoints} yet; starting from step 0")
    if last is None:  # a fresh start: stale checkpoints or log lines from an earlier run would mix into this one
        shutil.rmtree(checkpoints, ignore_errors=True)
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
        log_path.unlink(missing_ok=True)
    else:
        _truncate_log(log_path, _checkpoint_step(last))
        log(f"resume: continuing from {last.name}")

    trainer = build_trainer(config, model, processor, train_dataset, run_dir, log=log)
    backend = vmodel.backend_of(model)
    _write_resolved_args(trainer, run_dir / "grpo_config.json", backend=backend, recipe=config.training.recipe)
    log(f"trainer: {type(trainer).__name__} ({backend} backend), recipe {config.training.recipe}; resolved settings "
        f"in {run_dir / 'grpo_config.json'}")
    trainer.train(resume_from_checkpoint=str(last) if last else None)
    if standalone:
        from vlrl.export import export_adapter

        stats = export_adapter(trainer.model, processor, run_dir / "adapter")
        log(f"adapter: {stats['nonzero_lora_B']}/{stats['lora_B_tensors']} lora_B non-zero -> {run_dir / 'adapter'}")
    return trainer


def _write_resolved_args(trainer, path: Path, **extra) -> None:
    """The GRPOConfig values the trainer actually runs with (after Unsloth's own adjustments), and who ran it."""
    values = json.loads(trainer.args.to_json_string())
    values["vlrl"] = {**extra, "trainer_class": f"{type(trainer).__module__}.{type(trainer).__name__}",
                      "config_class": f"{type(trainer.args).__module__}.{type(trainer.args).__name__}"}
    path.write_text(json.dumps(values, indent=2, sort_keys=True))


def _check_same_config(config, path: Path) -> None:
    """Refuses to resume a run with a different configuration: the resumed run would not be the run it continues."""
    from vlrl import config as cfg

    changed = cfg.differences(config, path)
    if changed:
        raise cfg.ConfigError(f"cannot resume {path.parent}: its run started with a different configuration "
                              f"({'; '.join(changed)}); resume with the run file it started with "
                              f"(or omit --config to use {path}), or train into a new --output-dir.")


def _checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[-1])


def _last_checkpoint(folder: Path) -> Path | None:
    """The checkpoint with the highest step that was written completely (trainer_state.json is saved last)."""
    steps = [(_checkpoint_step(p), p) for p in folder.glob("checkpoint-*")
             if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").exists()]
    return max(steps)[1] if steps else None


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
