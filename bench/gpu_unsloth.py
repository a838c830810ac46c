"""Unsloth against vlrl's paths at the 8B MathVista preset's shape, one path per process (issue 46): Qwen3-VL-8B's
config with random weights in 4-bit, 512x512 pictures, 8 prompts x 4 completions per optimizer step, each
completion length of --lengths in turn on the same loaded model.

Paths:
- `unsloth`: Unsloth's own vision GRPO notebook configuration: `FastVisionModel.from_pretrained(load_in_4bit=True)`,
  its `get_peft_model` (language layers, r 16, alpha 16), its patched `GRPOTrainer` with its own generation, and the
  notebook's GRPOConfig values where they differ from TRL's (adam betas 0.9/0.99, weight decay 0.1, warmup 0.1 of the steps,
  cosine, adamw_8bit, max_grad_norm 0.1, sequence-level ratios, dr_grpo). The notebook decodes with vLLM
  (`fast_inference=True`), which the GPU machine cannot install: this path decodes with Unsloth's transformers
  generate. The vision placeholders are suppressed (`suppress_tokens`): random weights sample them, and Unsloth's
  loss then fails (the `repro` path).
- `vlrl-unsloth`: vlrl on the Unsloth backend (`load_model(backend="unsloth")`, `train.build_trainer`): the engine's
  rollouts, Unsloth's loss, the mismatch measured; the adapter exported and verified after the last length.
- `vlrl`: the preset's path: transformers + PEFT on the NF4 base, int8-packed for decoding, the engine's compiled
  rollouts (16 at once), micro-batch 4, token-level importance sampling correction.
- `trl`: plain TRL with the seed recipe's defaults (`gpu_engine.plain_trl_trainer`).
- `repro`: Unsloth's own trainer on the 2B shape with `<|video_pad|>` made likely (`sequence_bias`): its loss fails in
  `get_rope_index`; then the same with the placeholders suppressed, which trains.

    python bench/gpu_unsloth.py --path vlrl-unsloth --lengths 256 1024 --steps 2 --out $OUT/unsloth
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

START = time.time()
COMPLETIONS = 32  # per optimizer step: 8 prompts x 4 completions, the preset's rollout


def say(text: str) -> None:
    print(f"T+{time.time() - START:6.1f}s {text}", flush=True)


def notebook_config(out: Path, length: int, steps: int, **extra):
    """Unsloth's vision GRPO notebook's GRPOConfig at the benchmark's rollout size (8 x 4 completions per step)."""
    from trl import GRPOConfig

    values = {"learning_rate": 5e-6, "adam_beta1": 0.9, "adam_beta2": 0.99, "weight_decay": 0.1, "warmup_steps": 0.1,
              "lr_scheduler_type": "cosine", "optim": "adamw_8bit", "max_grad_norm": 0.1, "logging_steps": 1,
              "importance_sampling_level": "sequence", "mask_truncated_completions": False, "loss_type": "dr_grpo",
              "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "num_generations": 4,
              "bf16": True, "seed": 3407, "save_strategy": "no", "report_to": "none"}
    return GRPOConfig(output_dir=str(out), max_completion_length=length, max_steps=steps, **{**values, **extra})


def load_unsloth_own(checkpoint: Path):
    from unsloth import FastVisionModel

    model, processor = FastVisionModel.from_pretrained(str(checkpoint), load_in_4bit=True, max_seq_length=2048,
                                                       use_gradient_checkpointing="unsloth")
    model = FastVisionModel.get_peft_model(model, finetune_vision_layers=False, finetune_language_layers=True,
                                           finetune_attention_modules=True, finetune_mlp_modules=True, r=16,
                                           lora_alpha=16, lora_dropout=0, bias="none", random_state=3407,
                                           use_gradient_checkpointing="unsloth")
    processor.tokenizer.padding_side = "left"
    return model, processor


def build(path: str, model, processor, data, out: Path, length: int, steps: int):
    from vlrl.grammar import rewards
    from vlrl.model import vision_tokens

    if path == "unsloth":
        from trl import GRPOTrainer

        args = notebook_config(out, length, steps,
                               generation_kwargs={"suppress_tokens": vision_tokens.vision_token_ids(processor)})
        return GRPOTrainer(model=model, processing_class=processor, reward_funcs=rewards.reward_funcs(), args=args,
                           train_dataset=data)
    if path == "trl":
        from gpu_engine import plain_trl_trainer

        return plain_trl_trainer(argparse.Namespace(completion=length, steps=steps, warmup=0), model, processor,
                                 data, out)
    from vlrl.config import runfile as cfg
    from vlrl.training import train

    config = cfg.preset("tiny")
    t = config.training
    t.per_device_train_batch_size, t.gradient_accumulation_steps = 4, COMPLETIONS // 4  # the 8B preset's
    t.num_generations, t.generation_batch_size = 4, ARGS.generation_batch
    t.max_completion_length, t.max_steps, t.learning_rate = length, steps, 5e-6
    t.save_steps, t.logging_steps = 10_000, 1
    t.warmup_steps = 0  # the recipe's 0.1 runs a 1-step run at learning rate 0, leaving the adapter untrained
    t.importance_sampling_correction = "token" if path == "vlrl" else "off"  # the preset's; refused on Unsloth
    config.model.backend = "unsloth" if path == "vlrl-unsloth" else "transformers"
    config.data.max_prompt_tokens = 512
    return train.build_trainer(config, model, processor, data, out)


def even_share(completions, completion_ids, **_):
    """A reward with variance on random weights: the share of a completion's tokens whose id is even. The recipe's
    rewards are all 0 there (no answer tags), so advantages, loss and the LoRA gradients would be 0 by construction
    and the adapter untrained; with this reward they are not, on every path alike."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def with_varied_reward(trainer):
    """`trainer` (TRL's GRPOTrainer, Unsloth's or vlrl's) with `even_share` added beside its rewards, weight 1."""
    import torch

    trainer.reward_funcs.append(even_share)
    trainer.reward_func_names.append("even_share")
    trainer.reward_processing_classes.append(None)
    trainer.reward_weights = torch.cat([trainer.reward_weights, torch.ones(1)])
    return trainer


def measure(path: str, model, processor, length: int, steps: int, warmup: int, out_dir: Path) -> dict:
    import torch
    from gpu_engine import dataset
    from gpu_gspo import Timer, step_clock

    data = dataset(COMPLETIONS * steps // 4 + 8)
    trainer = build(path, model, processor, data, out_dir / f"run-{path}-{length}", length, steps)
    if ARGS.varied_reward:
        with_varied_reward(trainer)
    timer, clock = Timer(), []
    trainer.add_callback(step_clock(timer, clock, lambda done: say(
        f"{path} {length}: step {len(done)} {done[-1]['step_s']:.1f} s "
        f"(generation {done[-1].get('generation_s', 0):.1f} s, {done[-1]['max_reserved_gib']:.1f} GiB reserved)")))
    from vlrl.training import trl_bridge

    timer.wrap(trainer, trl_bridge.method_name(trainer, "generate_rollouts"), "generation_s")
    torch.cuda.empty_cache()
    trainer.train()  # step_clock resets the allocator's peaks at each step's start
    logs = trainer.state.log_history
    pick = lambda key: [r[key] for r in logs if key in r]
    measured = clock[warmup:] or clock
    median = lambda xs: sorted(xs)[len(xs) // 2]
    step_s = median([s["step_s"] for s in measured])
    lengths = pick("completions/mean_length")
    mean_length = median(lengths[warmup:] or lengths) if lengths else length
    result = {
        "path": path, "completion": length, "gpu": torch.cuda.get_device_name(), "steps": clock,
        "measured_steps": len(measured), "step_s": step_s,
        "generation_s": median([s.get("generation_s", 0.0) for s in measured]),
        "mean_completion_tokens": mean_length, "completion_tokens_per_s": COMPLETIONS * mean_length / step_s,
        "max_reserved_gib": max(s["max_reserved_gib"] for s in clock),
        "max_allocated_gib": max(s["max_allocated_gib"] for s in clock),
        "rollout_train_kl": pick("sampling/rollout_train_kl"), "loss": pick("loss"), "grad_norm": pick("grad_norm"),
        "trainer_class": type(trainer).__name__, "torch": torch.__version__,
        "decoder": decoder(trainer, model),
    }
    if path == "vlrl-unsloth" and length == max(ARGS.lengths):
        from vlrl.export.adapter import export_adapter

        try:  # a failed export is a result beside the step's, which it must not take with it
            result["adapter"] = export_adapter(model, processor, out_dir / "adapter-vlrl-unsloth", log=say)
        except Exception as err:  # noqa: BLE001
            result["adapter_error"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
    del trainer
    return result


def decoder(trainer, model) -> str | None:
    """The engine's path for the trainer's rollouts (`vlrl.engine.decoder_of`), None where TRL or Unsloth decode."""
    from vlrl import engine

    decoding = getattr(trainer, "rollout_decoding", None)
    return engine.decoder_of(model, decoding) if decoding is not None else None


def repro(checkpoints: Path, out_dir: Path) -> dict:
    """Unsloth's own trainer, <|video_pad|> made likely: the failure, then the same with the placeholders
    suppressed."""
    from gpu_engine import dataset
    from gpu_gspo import build_checkpoint

    from vlrl.grammar import rewards
    from vlrl.model import vision_tokens
    from vlrl.training import trl_bridge

    checkpoint = build_checkpoint("2b", checkpoints)
    model, processor = load_unsloth_own(checkpoint)
    from trl import GRPOTrainer

    video = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    report = {"video_pad_id": video}
    for name, extra in (("bias", {}), ("bias+suppress", {"suppress_tokens": vision_tokens.vision_token_ids(processor)})):
        kwargs = {"sequence_bias": [[[video], 30.0]], **extra}
        args = notebook_config(out_dir / f"repro-{name}", 16, 1, per_device_train_batch_size=4,
                               gradient_accumulation_steps=1, generation_kwargs=kwargs)
        trainer = GRPOTrainer(model=model, processing_class=processor, reward_funcs=rewards.reward_funcs(),
                              args=args, train_dataset=dataset(16))
        seen, hook = [], trl_bridge.method_name(trainer, "generate_rollouts")
        original = getattr(trainer, hook)

        def spy(*a, _original=original, seen=seen, **k):
            ids, logps = _original(*a, **k)
            seen.append(sum(row.count(video) for row in ids))
            return ids, logps

        setattr(trainer, hook, spy)
        try:
            trainer.train()
            report[name] = {"ok": True, "video_pad_in_completions": seen, "loss": trainer.state.log_history[-1]}
        except Exception as err:  # noqa: BLE001 - the failure is the measurement
            report[name] = {"ok": False, "video_pad_in_completions": seen, "error": f"{type(err).__name__}: {err}",
                            "where": traceback.format_exc()[-1500:]}
        say(f"repro {name}: {json.dumps({k: v for k, v in report[name].items() if k != 'where'}, default=str)}")
    return report


def main() -> None:
    if ARGS.path in ("unsloth", "vlrl-unsloth", "repro"):
        import unsloth  # noqa: F401  (Unsloth patches transformers and TRL only when imported first)
    from gpu_gspo import build_checkpoint

    out_dir = Path(ARGS.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if ARGS.path == "repro":
        (out_dir / "repro.json").write_text(json.dumps(repro(Path(ARGS.checkpoints), out_dir), indent=2, default=str))
        return
    checkpoint = build_checkpoint("8b", Path(ARGS.checkpoints))
    say(f"{ARGS.path}: loading {checkpoint}")
    if ARGS.path == "unsloth":
        model, processor = load_unsloth_own(checkpoint)
    elif ARGS.path == "vlrl":
        from gpu_engine import load

        model, processor, _, _ = load(checkpoint, "int8")
    else:
        from vlrl.model.loading import LoraSettings, load_model

        model, processor = load_model(str(checkpoint), load_in_4bit=True, max_seq_length=2048,
                                      lora=LoraSettings(r=16, alpha=16),
                                      backend="unsloth" if ARGS.path == "vlrl-unsloth" else "transformers")
    for i, length in enumerate(ARGS.lengths):
        steps = ARGS.steps[min(i, len(ARGS.steps) - 1)] if ARGS.path != "trl" else 1  # plain TRL: eager, one step
        warmup = ARGS.warmup if steps > ARGS.warmup else 0
        try:
            result = measure(ARGS.path, model, processor, length, steps, warmup, out_dir)
        except Exception as err:  # noqa: BLE001 - a failing length is a result too
            result = {"path": ARGS.path, "completion": length, "ok": False, "error": f"{type(err).__name__}: {err}",
                      "where": traceback.format_exc()[-3000:]}
            traceback.print_exc()
        (out_dir / f"{ARGS.path}_{length}.json").write_text(json.dumps(result, indent=2, default=str))
        keys = ("step_s", "generation_s", "completion_tokens_per_s", "max_reserved_gib", "rollout_train_kl", "error")
        say(f"RESULT {ARGS.path} {length} " + json.dumps({k: result.get(k) for k in keys}, default=str))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True, choices=["unsloth", "vlrl-unsloth", "vlrl", "trl", "repro"])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--steps", type=int, nargs="+", default=[2],
                   help="optimizer steps at each length, the last value for the rest (plain TRL: 1)")
    p.add_argument("--varied-reward", action=argparse.BooleanOptionalAction, default=True,
                   help="add `even_share` beside the recipe's rewards (random weights score 0 on those alone)")
    p.add_argument("--generation-batch", type=int, default=16, help="vlrl paths: rows decoded at once (the preset's 16)")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians (compiling)")
    p.add_argument("--checkpoints", default="/tmp/vlrl-bench")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results") + "/unsloth")
    ARGS = p.parse_args()
    main()
