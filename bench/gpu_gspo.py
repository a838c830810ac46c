"""GSPO step benchmark on one GPU: Qwen3-VL 2B/4B/8B and Qwen3.5 2B/4B/9B shapes (real configs, random weights),
512x512 images.

One process measures one (size, backend, completion length). Step time is split into generation, reward and
training by timing TRL's own methods; peak memory is torch's allocator peak; decode efficiency compares the measured
time per decoding step with the time to read the weights once at the measured device-to-device copy bandwidth.

    python bench/gpu_gspo.py --size 8b --backend bnb4 --completion 256 --steps 4 --out $OUT/results
    python bench/gpu_gspo.py --size 8b --backend bnb4 --completion 1024 --fast-generation --micro-batch 4
    python bench/gpu_gspo.py --size 8b --backend bnb4 --completion 1536 --fast-generation --micro-batch 4 \
        --thinking-budget 1024    # the qwen3-vl-8b-thinking-mathvista shape: a thinking prompt, </think> at 1024
    python bench/gpu_gspo.py --size qwen3.5-2b --backend bf16 --completion 1536 --fast-generation --micro-batch 4 \
        --thinking-budget 1024    # the qwen3.5-2b-mathvista preset's shape (qwen3.5-9b: --backend bnb4)

Backends: unsloth4 (Unsloth FastVisionModel, 4-bit), bnb4 (transformers + PEFT + bitsandbytes 4-bit),
bf16 (transformers + PEFT, bf16 weights). `--fast-generation` turns on vlrl's static-cache compiled decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# Real Qwen3-VL shapes (Qwen/Qwen3-VL-{2B,4B,8B}-Instruct config.json). Random weights cost the same as trained ones.
VISION_SMALL = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "deepstack_visual_indexes": [5, 11, 17]}
SHAPES = {
    "2b": {"text": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                         "num_key_value_heads": 8}, "vision": VISION_SMALL, "tie": True},
    "4b": {"text": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                         "num_key_value_heads": 8}, "vision": VISION_SMALL, "tie": True},
    "8b": {"text": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                         "num_key_value_heads": 8},
               "vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                           "deepstack_visual_indexes": [8, 16, 24]}, "tie": False},
}

# Qwen3.5 shapes (Qwen/Qwen3.5-{2B,4B,9B} config.json; transformers' Qwen3_5TextConfig defaults are the 9B's): a hybrid
# language model, Gated DeltaNet linear attention with full attention every fourth layer, head_dim 256 with a quarter
# rotated, Qwen3.5's 248,320-token vocabulary; a vision tower without deepstack. The 2B's and 4B's values are the hub
# configs' as recalled for issue 36 (the hub was not reachable from the machine that wrote them): check them against
# the hub's config.json when it is reachable (`--checkpoint` takes a real checkpoint instead).
QWEN35_VISION_SMALL = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16}
QWEN35_SHAPES = {
    "qwen3.5-2b": {"text": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
                            "num_attention_heads": 8, "num_key_value_heads": 2, "linear_num_key_heads": 16,
                            "linear_num_value_heads": 16}, "vision": QWEN35_VISION_SMALL, "tie": True},
    "qwen3.5-4b": {"text": {"hidden_size": 2560, "intermediate_size": 9216, "num_hidden_layers": 32,
                            "num_attention_heads": 16, "num_key_value_heads": 4, "linear_num_key_heads": 16,
                            "linear_num_value_heads": 32}, "vision": QWEN35_VISION_SMALL, "tie": True},
    "qwen3.5-9b": {"text": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
                            "num_attention_heads": 16, "num_key_value_heads": 4, "linear_num_key_heads": 16,
                            "linear_num_value_heads": 32},
                   "vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16},
                   "tie": False},
}
SHAPES.update(QWEN35_SHAPES)


def qwen35_config(size: str):
    from transformers import Qwen3_5Config

    from vlrl.model.tiny import QWEN35_IDS

    shape = QWEN35_SHAPES[size]
    text = dict(vocab_size=248320, head_dim=256, max_position_embeddings=262144, rms_norm_eps=1e-6,
                linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [11, 11, 10], "mrope_interleaved": True},
                bos_token_id=248044, eos_token_id=248046, pad_token_id=248044, **shape["text"])
    vision = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                  out_hidden_size=shape["text"]["hidden_size"], **shape["vision"])
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=shape["tie"], **QWEN35_IDS)


def qwen3_vl_config(size: str):
    from transformers import Qwen3VLConfig

    shape = SHAPES[size]
    text = dict(vocab_size=151936, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                                 "mrope_interleaved": True}, **shape["text"])
    vision = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                  out_hidden_size=shape["text"]["hidden_size"], **shape["vision"])
    return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=shape["tie"],
                         image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                         vision_end_token_id=151653, bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)


def build_checkpoint(size: str, root: Path) -> Path:
    """A random-weight checkpoint with the real config, saved like a hub checkpoint (bf16), built on the GPU."""
    import torch
    from transformers import Qwen3_5ForConditionalGeneration, Qwen3VLForConditionalGeneration

    from vlrl.model.tiny import build_processor

    qwen35 = size in QWEN35_SHAPES
    path = root / (f"{size}-random" if qwen35 else f"qwen3-vl-{size}-random")
    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # the CPU builds the 2B for export checks
        if qwen35:
            model = Qwen3_5ForConditionalGeneration(qwen35_config(size)).to(torch.bfloat16)
        else:
            model = Qwen3VLForConditionalGeneration(qwen3_vl_config(size)).to(torch.bfloat16)
    model.save_pretrained(path)
    build_processor(max_pixels=16384 * 28 * 28, family="qwen3_5" if qwen35 else "qwen3_vl").save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def count_own_context() -> None:
    """Processes sharing one GPU (bench/capped.sh's lanes, with VLRL_CAP_CONTEXT_GIB set; otherwise nothing changes):
    `[model] memory_cap_gib` then counts this process's own CUDA context, VLRL_CAP_CONTEXT_GIB as one process
    measured it alone, and not the other processes' memory, which a card of its own would not hold
    (`vlrl.model.memory_cap.cap_fraction` counts everything on the card outside the allocator). What the allocator may
    reserve is then the cap less that context, as on a card of its own."""
    if not os.environ.get("VLRL_CAP_CONTEXT_GIB"):
        return
    from vlrl.model import memory_cap

    context_gib, fraction = float(os.environ["VLRL_CAP_CONTEXT_GIB"]), memory_cap.cap_fraction
    memory_cap.cap_fraction = lambda cap, total, free, reserved: fraction(
        cap, total, total - reserved - int(context_gib * memory_cap.GIB), reserved)


def copy_bandwidth() -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + written)."""
    import torch

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 10
    del x, y
    return 2 * 2 * 1024**3 / seconds


def weight_bytes(model) -> int:
    """Bytes of the language-model weights a decoding step reads (vision runs once per prompt, not per token)."""
    total = 0
    for name, p in model.named_parameters():
        if ".visual." in name:
            continue
        total += p.numel() * p.element_size()
    for name, b in model.named_buffers():
        if ".visual." not in name and "absmax" in name:
            total += b.numel() * b.element_size()
    return total


def load(size: str, backend: str, path: Path):
    from vlrl.model.loading import LoraSettings, load_model

    lora = LoraSettings(r=16, alpha=16)
    if backend == "unsloth4":
        return load_model(str(path), load_in_4bit=True, max_seq_length=2048, lora=lora, backend="unsloth")
    return load_model(str(path), load_in_4bit=backend == "bnb4", max_seq_length=2048, lora=lora,
                      backend="transformers")


class Timer:
    """Accumulates wall time (CUDA-synchronized) of wrapped methods, and their calls (`KEY_calls`), per step."""

    def __init__(self):
        self.totals: dict[str, float] = {}

    def wrap(self, obj, method: str, key: str):
        import torch

        original = getattr(obj, method)

        def timed(*args, **kwargs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                torch.cuda.synchronize()
                self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - start
                self.totals[f"{key}_calls"] = self.totals.get(f"{key}_calls", 0) + 1

        setattr(obj, method, timed)


def step_clock(timer: Timer, steps: list, report=None):
    """A trainer callback that appends each optimizer step's wall time (CUDA-synchronized), the `timer`'s totals
    within it and the allocator's peaks in it (reset at each step's start: the run's are the steps' largest) to
    `steps`, then calls `report(steps)` if given."""
    import torch
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start, timer.totals = time.perf_counter(), {}

        def on_step_end(self, *a, **k):
            torch.cuda.synchronize()
            steps.append({"step_s": time.perf_counter() - self.start, **timer.totals,
                          "max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                          "max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30})
            if report is not None:
                report(steps)

    return StepClock()


def bench_train(args, model, processor, bandwidth: float, correction: str = "off") -> dict:
    from vlrl.base import synthetic
    from vlrl.config import runfile as cfg
    from vlrl.model import prompts
    from vlrl.training import train, trl_bridge

    config = cfg.preset("tiny")
    config.training.importance_sampling_correction = correction
    t = config.training
    # --generation-batch rollouts (8) decoded per generate call and one optimizer step per rollout; --micro-batch
    # splits the training forward of those into accumulation steps (less activation and logit memory, the same step).
    g = args.generation_batch
    t.per_device_train_batch_size, t.gradient_accumulation_steps = args.micro_batch, g // args.micro_batch
    t.num_generations, t.generation_batch_size = 4, g
    t.max_completion_length, t.max_steps, t.learning_rate, t.save_steps = args.completion, args.steps, 5e-6, 10_000
    config.model.backend = "unsloth" if args.backend == "unsloth4" else "transformers"
    config.data.max_prompt_tokens = 512  # 512x512 image = 256 image tokens + the question: the static cache's budget
    if args.thinking_budget:  # a Qwen3-VL-Thinking prompt (the turn opens <think>), the budget's processor per rollout
        processor.chat_template = prompts.THINKING_CHAT_TEMPLATE
        t.thinking_budget = args.thinking_budget
    items = synthetic.generate(g * (args.steps + 1) // 4 + 8, seed=3, image_size=512)
    dataset = prompts.to_dataset(items)
    timer, steps = Timer(), []
    trainer = train.build_trainer(config, model, processor, dataset, Path(args.out) / f"run-{correction}",
                                  fast_generation=args.fast_generation, callbacks=[step_clock(timer, steps)])
    timer.wrap(trainer, trl_bridge.method_name(trainer, "generate_rollouts"), "generation_s")
    timer.wrap(trainer, trl_bridge.method_name(trainer, "score_rewards"), "reward_s")
    trainer.train()  # step_clock resets the allocator's peaks at each step's start
    lengths = [r.get("completions/mean_length") for r in trainer.state.log_history if "completions/mean_length" in r]
    cut = [r["thinking/cut_rate"] for r in trainer.state.log_history if "thinking/cut_rate" in r]
    mismatch = [{k: r[k] for k in r if k.startswith("sampling/")} for r in trainer.state.log_history
                if "sampling/rollout_train_kl" in r]  # per optimizer step (vlrl.training.mismatch.METRICS)
    after_warmup = steps[args.warmup:] or steps
    median = lambda xs: sorted(xs)[len(xs) // 2]
    gen = median([s.get("generation_s", 0.0) for s in after_warmup])
    step = median([s["step_s"] for s in after_warmup])
    reward = median([s.get("reward_s", 0.0) for s in after_warmup])
    g = args.generation_batch  # completions per step, all decoded in one call
    tokens = g * (median(lengths[args.warmup:] or lengths) if lengths else args.completion)
    wbytes = weight_bytes(model)
    per_token = gen / max(1.0, tokens / g)
    bound = wbytes / (bandwidth / 2)  # reading the weights once: bytes / read bandwidth (copy counts read+write)
    return {
        "steps": steps, "step_s": step, "generation_s": gen, "reward_s": reward, "training_s": step - gen - reward,
        "completion_tokens_per_step": tokens, "completion_tokens_per_s": tokens / step,
        "decode_ms_per_token_step": 1000 * per_token, "weight_bytes": wbytes, "weight_read_ms": 1000 * bound,
        "decode_efficiency": bound / per_token,
        "max_allocated_gib": max(s["max_allocated_gib"] for s in steps),
        "max_reserved_gib": max(s["max_reserved_gib"] for s in steps),
        "thinking_cut_rate": sum(cut) / len(cut) if cut else None,  # random weights never close a block themselves
        "importance_sampling_correction": correction, "mismatch_per_step": mismatch,
    }


def main() -> None:
    import sys

    if "unsloth4" in sys.argv:
        import unsloth  # noqa: F401  (Unsloth patches transformers only when imported first)

    p = argparse.ArgumentParser()
    p.add_argument("--size", choices=SHAPES, default="8b")
    p.add_argument("--backend", choices=["unsloth4", "bnb4", "bf16"], default="bnb4")
    p.add_argument("--completion", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--fast-generation", action="store_true")
    p.add_argument("--micro-batch", type=int, choices=[1, 2, 4, 8], default=8,
                   help="completions per training forward (8: the recipe's per_device_train_batch_size)")
    p.add_argument("--generation-batch", type=int, choices=[8, 16, 32], default=8,
                   help="completions decoded at once, and per optimizer step ([training] generation_batch_size)")
    p.add_argument("--thinking-budget", type=int, default=0,
                   help="a thinking chat template and [training] thinking_budget = N (0: an Instruct prompt)")
    p.add_argument("--checkpoints", default="/tmp/vlrl-bench")
    p.add_argument("--checkpoint", help="a saved checkpoint instead of building one (4-bit if it is pre-quantized)")
    p.add_argument("--corrections", nargs="+", default=["off"], choices=["off", "token", "sequence"],
                   help="[training] importance_sampling_correction: one run each, in turn, on the same loaded model")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = p.parse_args()
    path = Path(args.checkpoint) if args.checkpoint else build_checkpoint(args.size, Path(args.checkpoints))
    bandwidth = copy_bandwidth()
    model, processor = load(args.size, args.backend, path)
    for correction in args.corrections:
        run_one(args, model, processor, bandwidth, correction)


def run_one(args, model, processor, bandwidth: float, correction: str) -> None:
    import torch

    started = time.time()
    result = bench_train(args, model, processor, bandwidth, correction)
    result.update(size=args.size, backend=args.backend, completion=args.completion, fast_generation=args.fast_generation,
                  micro_batch=args.micro_batch, generation_batch=args.generation_batch,
                  thinking_budget=args.thinking_budget,
                  gpu=torch.cuda.get_device_name(), copy_bandwidth_tb_s=bandwidth / 1e12,
                  wall_s=time.time() - started, torch=torch.__version__,
                  cuda_alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    expandable = "expandable_segments:True" in (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    name = (f"gspo_{args.size}_{args.backend}{'_fast' if args.fast_generation else ''}_{args.completion}"
            f"{'_expandable' if expandable else ''}{f'_micro{args.micro_batch}' if args.micro_batch != 8 else ''}"
            f"{f'_gen{args.generation_batch}' if args.generation_batch != 8 else ''}"
            f"{f'_think{args.thinking_budget}' if args.thinking_budget else ''}"
            f"{f'_tis-{correction}' if correction != 'off' or len(args.corrections) > 1 else ''}.json")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text(json.dumps(result, indent=2))
    keys = ("step_s", "generation_s", "reward_s", "training_s", "completion_tokens_per_s", "decode_ms_per_token_step",
            "weight_read_ms", "decode_efficiency", "max_allocated_gib", "max_reserved_gib")
    print("RESULT", name, json.dumps({k: round(result[k], 3) for k in keys}))
    for n, step in enumerate(result["mismatch_per_step"], 1):
        print("MISMATCH", name, n, json.dumps({k.removeprefix("sampling/"): float(f"{v:.4g}") for k, v in step.items()}))


if __name__ == "__main__":
    main()
