"""Rollout decode table (issues 18 and 19): completions decoded at once (8, 16, 32) x 1024 tokens, one model load.

For each batch size, the policy (LoRA r 16 on the language model, as the presets train it) decodes real-size prompts
(512 px pictures, 256 image tokens) through vlrl's fast path: a static KV cache sized as vlrl sizes it (the longest
prompt rounded up to 64, plus the completion budget: `vlrl.prompts.cache_length`) and compiled decoding
(`vlrl.model.compiled_decoding`), sampling at temperature 1, every completion forced to the full length. A short
generate first compiles that batch's graph; then one timed generate of 1 token (the prefill) and one of the full
length give the time per decoding step. Memory: the allocator's peak reserved and allocated during the timed decode.

`--paths bitsandbytes fused` times each batch through bitsandbytes' own 4-bit layers and through vlrl's fused 4-bit
decode (`vlrl.nf4_decode.fused_decode`). `--agreement` first checks that the fused kernel computes what bitsandbytes
computes: both decode the same prompts greedily (eager), and each step's logits are compared while the two token
sequences are still the same. `--recorder` also times the first batch with the mismatch recorder on
(`vlrl.mismatch.recording`). `--runs 8:fused 32:bitsandbytes ...` picks the (batch, path) pairs and their order.
Every phase is printed with its start time, and `warmup_s` (the first, compiling generate of a batch) says what
compiling that batch's decoding graph cost.

The share of the bound: the language model's weights read once per decoding step (`weight_bytes`: every
non-vision weight, the issue's convention) at half the measured copy bandwidth (`decode_efficiency`), and, stricter,
the bytes a step really reads (the input embedding table left out where it is not the lm_head) at the whole copy
bandwidth, which a read-only stream can approach (`decode_efficiency_strict`).

    python bench/gpu_decode.py --checkpoint /tmp/ckpt/qwen3-vl-8b-random-bnb4 --size 8b --paths bitsandbytes fused \
        --agreement --out $OUT/decode
    python bench/gpu_decode.py --checkpoint /tmp/ckpt/qwen3-vl-4b-random --size 4b --out $OUT/decode
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_gspo import copy_bandwidth, weight_bytes


def inputs_for(processor, count: int, device):
    from vlrl import prompts, synthetic

    rows = prompts.to_dataset(synthetic.generate(count, seed=3, image_size=512))
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    images = [image for r in rows for image in prompts.row_images(r, decode=True)]
    return processor(text=texts, images=images, return_tensors="pt", padding=True).to(device)


def timed_generate(model, inputs, new_tokens: int, fast: dict) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                       temperature=1.0, top_p=None, top_k=None, **fast)
    torch.cuda.synchronize()
    return time.perf_counter() - start


START = time.time()


def say(text: str) -> None:
    print(f"T+{time.time() - START:6.1f}s {text}", flush=True)


def step_read_bytes(model) -> int:
    """Bytes one decoding step reads: `weight_bytes` less the input embedding table, of which a step reads one row
    per sequence (unless the lm_head is that same table, which it reads whole)."""
    head = model.get_output_embeddings().weight
    embed = model.get_input_embeddings().weight
    return weight_bytes(model) - (0 if embed is head else embed.numel() * embed.element_size())


def agreement(model, inputs, steps: int = 32) -> dict:
    """Greedy decoding through bitsandbytes and through the fused kernel (eager, dynamic cache), compared step by
    step while each row's two sequences agree: the largest logit difference (relative to the logits' range) and the
    largest KL divergence between the two next-token distributions, and where the sequences first part."""
    import torch

    from vlrl.nf4_decode import fused_decode

    def decode():
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        return out.sequences[:, inputs["input_ids"].shape[1]:], torch.stack(out.logits, dim=1).float()

    tokens, logits = decode()
    with fused_decode(model) as patched:
        fused_tokens, fused_logits = decode()
    same = (tokens == fused_tokens).int().cumprod(dim=1)  # 1 while the row's sequences still agree
    compared = torch.cat([torch.ones_like(same[:, :1]), same[:, :-1]], dim=1).bool()  # steps with the same context
    delta = (logits - fused_logits).abs().amax(dim=-1)[compared]
    scale = (logits.amax(dim=-1) - logits.amin(dim=-1))[compared]
    kl = torch.nn.functional.kl_div(fused_logits.log_softmax(-1), logits.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)[compared]
    return {"layers_patched": patched, "steps": steps, "rows": tokens.shape[0], "compared_steps": int(compared.sum()),
            "identical_rows": int(same[:, -1].sum()), "first_difference": [int(n) for n in same.sum(dim=1)],
            "max_abs_logit_delta": round(float(delta.max()), 5), "logit_range": round(float(scale.mean()), 3),
            "max_relative_delta": round(float((delta / scale).max()), 6), "max_kl": float(kl.max()),
            "mean_kl": float(kl.mean())}


def measure(model, inputs, completion: int, fast: dict, bound_ms: float, strict_ms: float) -> dict:
    import torch

    warmup = timed_generate(model, inputs, 8, fast)  # compiles this batch size's decoding graph
    say(f"warm-up (compile) {warmup:.1f} s")
    prefill = timed_generate(model, inputs, 1, fast)
    torch.cuda.reset_peak_memory_stats()
    whole = timed_generate(model, inputs, completion, fast)
    step_ms = 1000 * (whole - prefill) / (completion - 1)
    batch = inputs["input_ids"].shape[0]
    return {"batch": batch, "warmup_s": round(warmup, 1), "seconds": round(whole, 2), "prefill_s": round(prefill, 3),
            "step_ms": round(step_ms, 2),
            "tokens_per_s": round(batch * completion / whole, 1), "decode_efficiency": round(bound_ms / step_ms, 3),
            "decode_efficiency_strict": round(strict_ms / step_ms, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def main() -> None:
    import contextlib

    import torch

    from vlrl import mismatch
    from vlrl import model as vmodel
    from vlrl.nf4_decode import fused_decode

    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--completion", type=int, default=1024)
    p.add_argument("--paths", nargs="+", choices=["bitsandbytes", "fused", "bf16"],
                   help="decoding paths to time (default: the checkpoint's own: bitsandbytes for 4-bit, else bf16)")
    p.add_argument("--runs", nargs="+", metavar="BATCH:PATH",
                   help="the (batch, path) pairs to time, in this order (default: every batch with every path)")
    p.add_argument("--agreement", action="store_true", help="check the fused kernel's logits against bitsandbytes'")
    p.add_argument("--recorder", action="store_true", help="also time the first batch with the mismatch recorder")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth()
    config = json.loads((Path(args.checkpoint) / "config.json").read_text())
    four_bit = "quantization_config" in config
    base, processor = vmodel.load_model(args.checkpoint, load_in_4bit=four_bit, max_seq_length=4096,
                                        backend="transformers")
    policy = vmodel.add_lora(base, vmodel.LoraSettings(r=16, alpha=16), backend="transformers")
    policy.eval()
    read, strict_read = weight_bytes(policy), step_read_bytes(policy)
    bound_ms, strict_ms = 1000 * read / (bandwidth / 2), 1000 * strict_read / bandwidth
    result = {"size": args.size, "checkpoint": args.checkpoint, "four_bit": four_bit, "completion": args.completion,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_bandwidth_tb_s": round(bandwidth / 1e12, 3), "weight_bytes": read,
              "weight_read_ms": round(bound_ms, 3), "step_read_bytes": strict_read,
              "step_read_ms_strict": round(strict_ms, 3), "rows": []}
    name = out / f"decode_{args.size}{'_bnb4' if four_bit else '_bf16'}.json"
    paths = args.paths or ["bitsandbytes" if four_bit else "bf16"]
    say(f"loaded; paths {paths}")
    runs = [(int(b), path) for b, path in (r.split(":") for r in args.runs)] if args.runs else \
        [(batch, path) for batch in args.batches for path in paths]
    for batch, path in runs:
        inputs = inputs_for(processor, batch, policy.device)
        length = int(inputs["attention_mask"].sum(dim=1).max())
        fast = vmodel.compiled_decoding(policy, -(-length // 64) * 64 + args.completion)  # as prompts.cache_length
        if args.agreement and "agreement" not in result:
            say("agreement")
            result["agreement"] = agreement(policy, inputs)
            print("AGREEMENT", json.dumps(result["agreement"]), flush=True)
        patched = fused_decode(policy) if path == "fused" else contextlib.nullcontext()
        say(f"batch {batch}, {path}")
        try:
            with patched:
                row = {"path": path, **measure(policy, inputs, args.completion, fast, bound_ms, strict_ms),
                       "prompt_tokens": length, "cache_length": fast["max_cache_len"]}
        except Exception as error:  # noqa: BLE001  (out of memory, a kernel that fails: the table goes on)
            row = {"path": path, "batch": batch, "error": f"{type(error).__name__}: {str(error)[:300]}"}
        result["rows"].append(row)
        print("ROW", json.dumps(row), flush=True)
        if args.recorder and "recorder" not in result and "error" not in row:
            with mismatch.recording(policy):
                recorded = measure(policy, inputs, args.completion, fast, bound_ms, strict_ms)
            result["recorder"] = {"path": path, "batch": batch, "step_ms_off": row["step_ms"],
                                  "step_ms_on": recorded["step_ms"],
                                  "peak_reserved_gib_on": recorded["peak_reserved_gib"]}
            print("RECORDER", json.dumps(result["recorder"]), flush=True)
        name.write_text(json.dumps(result, indent=2))
        del inputs
        torch.cuda.empty_cache()
    print("RESULT", name.name, json.dumps([(r["path"], r["batch"], r.get("step_ms", r.get("error")))
                                           for r in result["rows"]]))


if __name__ == "__main__":
    main()
