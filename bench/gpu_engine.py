"""The decoding engine against plain TRL, side by side in one process on one GPU (issue 32): GSPO steps at the real
Qwen3-VL shapes (random weights, 512x512 pictures), completion tokens per second, the decode step against the
bandwidth bound, peak memory, and the rollout/training mismatch.

Paths (each loads the model afresh; the checkpoint is built once):
- `trl`: what a user of the seed recipe gets from TRL itself: transformers + PEFT + bitsandbytes 4-bit, TRL's own
  `GRPOTrainer` with the recipe's TRL defaults (per_device_train_batch_size 8 x gradient_accumulation_steps 4: TRL
  decodes all 32 completions of a step at once, eager, with a dynamic cache).
- `vlrl`: vlrl's trainer (`vlrl.training.train.build_trainer`): the engine's compiled static-cache rollouts on the NF4 base,
  `--generation-batch` completions at once, `--micro-batch` per training forward, 32 completions per optimizer step.
- `vlrl-FORMAT` (e.g. `vlrl-int8`): the same with the frozen base packed once at load for decoding
  (`vlrl.engine.weights.pack_for_decoding(model, FORMAT)`).

    python bench/gpu_engine.py --size 8b --completion 256 --paths trl vlrl vlrl-int8 --out $OUT/engine
    python bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --generation-batch 32 --micro-batch 4
    python bench/gpu_engine.py --size 8b --completion 1024 --paths vlrl-int8 --inputs 2-images 16-frames  # issue 48

`--inputs`, one run per path and input: `1-image` (512x512, the default), `2-images` (two 512x512 charts,
`two_chart_compare`), `16-frames` (16 frames of 512x512, `shape_motion`, under a clip budget of 16 x 256 x 256
pixels: 512 video tokens); prompts up to 1,024 tokens for the last two (bench/results/inputs.md).

One JSON per (path, completion) under --out, and a table line per run (`RESULT`). The bound: the language model's
4-bit weights (every non-vision weight of the NF4 model, `gpu_gspo.weight_bytes`) read once per decoding step at
half the measured copy bandwidth, the issue's convention, whatever format the path decodes from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_gspo import (
    SHAPES,
    Timer,
    build_checkpoint,
    copy_bandwidth,
    count_own_context,
    step_clock,
    weight_bytes,
)

START = time.time()
# What `vlrl run` gets (vlrl.model.loading sets it when the user has not): this script starts CUDA (the copy bandwidth)
# before the loader could, so it sets it itself. Results from before 2026-11-29 ran without it unless the shell set it.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def say(text: str) -> None:
    print(f"T+{time.time() - START:6.1f}s {text}", flush=True)


INPUTS = {"1-image": (), "2-images": ("two_chart_compare",), "16-frames": ("shape_motion",)}
CLIP_FRAMES, CLIP_PIXELS = 16, 16 * 256 * 256  # the video row: 16 frames, the clip's pixel budget (all frames)
CAP = [0.0]  # --memory-cap-gib: every load under `[model] memory_cap_gib`'s hard cap


def dataset(count: int, inputs: str = "1-image"):
    from vlrl.base import synthetic
    from vlrl.model import prompts

    if inputs == "16-frames":  # the synthetic clips are MOTION_FRAMES long; the row draws them 16 frames long
        synthetic.MOTION_FRAMES, synthetic.MOTION_FPS = CLIP_FRAMES, 8
    tasks = INPUTS[inputs] or synthetic.TASKS
    return prompts.to_dataset(synthetic.generate(count, seed=3, image_size=512, tasks=tasks))


def load(path: Path, fmt: str | None, four_bit: bool = True):
    import torch

    from vlrl.model.loading import LoraSettings, load_model

    policy, processor = load_model(str(path), load_in_4bit=four_bit, max_seq_length=2048,
                                   lora=LoraSettings(r=16, alpha=16), backend="transformers", memory_cap_gib=CAP[0])
    nf4_bytes, report = weight_bytes(policy), None
    if fmt:
        from vlrl.engine.weights import pack_for_decoding

        report = pack_for_decoding(policy, fmt)
        torch.cuda.empty_cache()
    return policy, processor, report, nf4_bytes


def plain_trl_trainer(args, policy, processor, data, out: Path):
    """TRL's GRPOTrainer as a user of the seed recipe builds it: vlrl's rewards and recipe values, TRL's defaults."""
    from trl import GRPOTrainer

    from vlrl.config.recipe import gspo_config
    from vlrl.grammar import rewards

    config = gspo_config(output_dir=str(out), per_device_train_batch_size=8, gradient_accumulation_steps=4,
                         num_generations=4, max_completion_length=args.completion, max_steps=args.steps + args.warmup,
                         learning_rate=5e-6, logging_steps=1, save_strategy="no", report_to=[], seed=0)
    return GRPOTrainer(model=policy, reward_funcs=rewards.reward_funcs(), args=config, train_dataset=data,
                       processing_class=processor)


def vlrl_trainer(args, policy, processor, data, out: Path):
    from vlrl.config import runfile as cfg
    from vlrl.training import train

    config = cfg.preset("tiny")
    t = config.training
    t.per_device_train_batch_size, t.gradient_accumulation_steps = args.micro_batch, 32 // args.micro_batch
    t.num_generations, t.generation_batch_size = 4, args.generation_batch
    t.max_completion_length, t.max_steps, t.learning_rate = args.completion, args.steps + args.warmup, 5e-6
    t.pass_tokens = args.pass_tokens  # [training] pass_tokens: micro-batches merged into passes of this many tokens
    t.compiled_layers = args.compiled_layers  # [training] compiled_layers: the decoder layers' training forwards
    t.save_steps, t.logging_steps = 10_000, 1
    config.data.max_prompt_tokens = 512 if args.inputs == ["1-image"] else 1024  # a 512x512 picture: 256 tokens
    return train.build_trainer(config, policy, processor, data, out)


def pass_schedule(trainer, steps: list, values: list[int]):
    """A callback that sets vlrl's trainer's `pass_tokens` to `values[k]` for its k-th optimizer step and records it
    in that step's entry of `steps` (step_clock's, which appends after this callback's step end)."""
    from transformers import TrainerCallback

    class PassSchedule(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            trainer.pass_tokens = values[min(state.global_step, len(values) - 1)]

        def on_train_end(self, args, state, control, **kwargs):
            for step, value in zip(steps, values):
                step["pass_tokens"] = value

    return PassSchedule()


def run(args, path: str, checkpoint: Path, bandwidth: float, inputs: str = "1-image") -> dict:
    import torch

    fmt = path.split("-", 1)[1] if path.startswith("vlrl-") else None
    say(f"{path}: loading ({inputs})")
    policy, processor, packed, nf4_bytes = load(checkpoint, fmt, not args.bf16)
    if inputs == "16-frames":
        from vlrl.model.pixel_budget import set_video_budget

        say(f"video budget {set_video_budget(processor, CLIP_PIXELS)}")
    data = dataset(32 * (args.steps + args.warmup) // 4 + 8, inputs)
    out = Path(args.out) / f"run-{path}-{args.completion}-{inputs}"
    build = plain_trl_trainer if path == "trl" else vlrl_trainer
    trainer = build(args, policy, processor, data, out)
    timer, steps = Timer(), []
    if args.pass_tokens_per_step and path != "trl":  # one load and one compile, then a measured step per setting
        trainer.add_callback(pass_schedule(trainer, steps, [args.pass_tokens_per_step[0]] * args.warmup
                                           + args.pass_tokens_per_step))
    trainer.add_callback(step_clock(timer, steps, lambda done: say(
        f"{path}: step {len(done)} {done[-1]['step_s']:.1f} s (generation {done[-1].get('generation_s', 0):.1f} s)")))
    from vlrl.training import compiled_layers, trl_bridge

    timer.wrap(trainer, trl_bridge.method_name(trainer, "generate_rollouts"), "generation_s")
    # the training half's parts (issue 50 point 2): scoring around the generation (rewards, any extra forward), the
    # passes (forward + backward of each micro-batch or merged pass), and every log-prob forward with its count
    timer.wrap(trainer, trl_bridge.method_name(trainer, "generate_and_score"), "generate_and_score_s")
    timer.wrap(trainer, "training_step", "passes_s")
    timer.wrap(trainer, trl_bridge.method_name(trainer, "token_logps"), "token_logps_s")
    trainer.train()  # step_clock resets the allocator's peaks at each step's start
    logs = trainer.state.log_history
    lengths = [r["completions/mean_length"] for r in logs if "completions/mean_length" in r]
    kl = [r["sampling/rollout_train_kl"] for r in logs if "sampling/rollout_train_kl" in r]
    rollout_time = [r["rollout_time"] for r in logs if "rollout_time" in r]  # vlrl's own log of the same split
    # vlrl's engine's own marks, a step each: its prefills' seconds and one decoding step's ms (CUDA events)
    prefill_time = [r["rollout/prefill_time"] for r in logs if "rollout/prefill_time" in r]
    steps_ms = [r["rollout/decode_ms_per_step"] for r in logs if "rollout/decode_ms_per_step" in r]
    measured = steps[args.warmup:] or steps
    median = lambda xs: sorted(xs)[len(xs) // 2]
    step_s, gen_s = median([s["step_s"] for s in measured]), median([s["generation_s"] for s in measured])
    mean_length = median(lengths[args.warmup:] or lengths) if lengths else args.completion
    tokens = 32 * mean_length
    calls = 32 // (32 if path == "trl" else args.generation_batch)  # generate calls per optimizer step
    decode_ms = 1000 * gen_s / (calls * mean_length)
    bound_ms = 1000 * nf4_bytes / (bandwidth / 2)
    # decode_ms: the whole generation (pictures' encoder and prefill included) over its decoding steps; vlrl's rows
    # also get the engine's own decoding-step ms without the prefills (`DECODE` lines)
    steps_only_ms = median(steps_ms[args.warmup:] or steps_ms) if steps_ms else None
    result = {
        "path": path, "input": inputs, "completion": args.completion, "size": args.size, "gpu": torch.cuda.get_device_name(),
        "generation_batch": 32 if path == "trl" else args.generation_batch,
        "micro_batch": 8 if path == "trl" else args.micro_batch, "pass_tokens": 0 if path == "trl" else args.pass_tokens,
        "steps": steps, "warmup": args.warmup, "step_s": step_s,
        "generation_s": gen_s, "training_s": step_s - gen_s, "mean_completion_tokens": mean_length,
        "completion_tokens_per_s": tokens / step_s, "decode_ms_per_step": decode_ms,
        "nf4_weight_bytes": nf4_bytes, "bound_ms": bound_ms, "decode_bound_share": bound_ms / decode_ms,
        "logged_prefill_s": prefill_time, "logged_decode_ms_per_step": steps_ms,
        "decode_steps_only_ms": steps_only_ms, "decode_steps_only_bound_share": steps_only_ms and bound_ms / steps_only_ms,
        "max_reserved_gib": max(s["max_reserved_gib"] for s in steps),
        "max_allocated_gib": max(s["max_allocated_gib"] for s in steps),
        "memory_cap_gib": CAP[0] or None, "pid": os.getpid(), "rollout_train_kl": kl, "logged_rollout_time": rollout_time, "packed": packed, "copy_bandwidth_tb_s": bandwidth / 1e12,
        "compiled_layers": compiled_layers.switched_layers(policy),
        "torch": torch.__version__, "wall_s": time.time() - START,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result["weights"] = "bf16" if args.bf16 else "nf4"
    weights = "_bf16" if args.bf16 else ""
    label = "" if inputs == "1-image" else f"_{inputs}"
    name = f"gspo_{args.size}_{path}{weights}_{args.completion}{label}_gen{result['generation_batch']}.json"
    (Path(args.out) / name).write_text(json.dumps(result, indent=2, default=str))
    keys = ("step_s", "generation_s", "completion_tokens_per_s", "decode_ms_per_step", "decode_bound_share",
            "max_reserved_gib")
    print("RESULT", name, json.dumps({k: round(result[k], 3) for k in keys}), "KL", kl, flush=True)
    if steps_ms:
        print("DECODE", name, json.dumps({"prefill_s": prefill_time, "decode_ms_per_step": steps_ms,
                                          "steps_only_bound_share": round(bound_ms / steps_only_ms, 3)}), flush=True)
    for step in measured:
        print("PARTS", name, json.dumps({k: round(v, 3) for k, v in step.items() if k.endswith(("_s", "_calls", "tokens"))}),
              flush=True)
    del trainer, policy
    torch.cuda.empty_cache()
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="8b", choices=SHAPES, help="a gpu_gspo.SHAPES shape: 2b .. 8b, qwen3.5-2b .. 9b")
    p.add_argument("--completion", type=int, default=256)
    p.add_argument("--paths", nargs="+", default=["trl", "vlrl"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="every path on bf16 weights (the 2B presets), not 4-bit")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--generation-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--pass-tokens", type=int, default=0, help="vlrl's [training] pass_tokens (0: a pass a micro-batch)")
    p.add_argument("--compiled-layers", type=int, choices=(0, 1), default=1,
                   help="vlrl's [training] compiled_layers (1, its default: the decoder layers' training forwards compiled)")
    p.add_argument("--pass-tokens-per-step", type=int, nargs="+", default=[],
                   help="vlrl's path only: one measured step at each of these pass_tokens, in one process (the warm-up "
                        "steps at the first); sets --steps")
    p.add_argument("--checkpoints", default="/tmp/vlrl-bench")
    p.add_argument("--checkpoint", help="this checkpoint (e.g. a pre-quantized 4-bit one) instead of building one")
    p.add_argument("--memory-cap-gib", type=float, default=0.0,
                   help="a hard cap on the process's GPU memory, the CUDA context counted (vlrl.model.memory_cap); with "
                        "VLRL_CAP_CONTEXT_GIB set, only this process's own context is counted (bench/capped.sh)")
    p.add_argument("--inputs", nargs="+", default=["1-image"], choices=INPUTS, help="what each item shows")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results") + "/engine")
    args = p.parse_args()
    args.steps = len(args.pass_tokens_per_step) or args.steps
    checkpoint = Path(args.checkpoint) if args.checkpoint else build_checkpoint(args.size, Path(args.checkpoints))
    CAP[0] = args.memory_cap_gib
    count_own_context()
    bandwidth = copy_bandwidth()
    say(f"checkpoint {checkpoint}, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    for path in args.paths:
        for inputs in args.inputs:
            try:
                run(args, path, checkpoint, bandwidth, inputs)
            except Exception as err:  # noqa: BLE001 - one path failing must not cost the others' numbers
                import traceback

                traceback.print_exc()
                print("FAILED", path, inputs, type(err).__name__, str(err)[:500], flush=True)


if __name__ == "__main__":
    main()
