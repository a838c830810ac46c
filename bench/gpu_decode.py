"""Rollout decode table (issues 18 and 19): completions decoded at once (8, 16, 32) x 1024 tokens, one model load.

For each batch size, the policy (LoRA r 16 on the language model, as the presets train it) decodes real-size prompts
(512 px pictures, 256 image tokens) through vlrl's fast path: a static KV cache sized as vlrl sizes it (the longest
prompt rounded up to 64, plus the completion budget: `vlrl.prompts.cache_length`) and compiled decoding
(`vlrl.model.compiled_decoding`), sampling at temperature 1, every completion forced to the full length. A short
generate first compiles that batch's graph; then one timed generate of 1 token (the prefill) and one of the full
length give the time per decoding step. Memory: the allocator's peak reserved and allocated during the timed decode.
At the first batch size it also times the same decode with the mismatch recorder on (`vlrl.mismatch.recording`),
and with `--fused` (where available) the fused 4-bit decode.

    python bench/gpu_decode.py --checkpoint /tmp/ckpt/qwen3-vl-8b-random-bnb4 --size 8b --out $OUT/decode
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


def measure(model, inputs, completion: int, fast: dict, bound_ms: float) -> dict:
    import torch

    timed_generate(model, inputs, 8, fast)  # compiles this batch size's decoding graph
    prefill = timed_generate(model, inputs, 1, fast)
    torch.cuda.reset_peak_memory_stats()
    whole = timed_generate(model, inputs, completion, fast)
    step_ms = 1000 * (whole - prefill) / (completion - 1)
    batch = inputs["input_ids"].shape[0]
    return {"batch": batch, "seconds": round(whole, 2), "prefill_s": round(prefill, 3), "step_ms": round(step_ms, 2),
            "tokens_per_s": round(batch * completion / whole, 1), "decode_efficiency": round(bound_ms / step_ms, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def main() -> None:
    import torch

    from vlrl import mismatch
    from vlrl import model as vmodel

    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--completion", type=int, default=1024)
    p.add_argument("--fused", action="store_true", help="also time vlrl's fused 4-bit decode, where it exists")
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
    bound_ms = 1000 * weight_bytes(policy) / (bandwidth / 2)
    result = {"size": args.size, "checkpoint": args.checkpoint, "four_bit": four_bit, "completion": args.completion,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_bandwidth_tb_s": round(bandwidth / 1e12, 3), "weight_bytes": weight_bytes(policy),
              "weight_read_ms": round(bound_ms, 3), "rows": []}
    name = out / f"decode_{args.size}{'_bnb4' if four_bit else '_bf16'}.json"
    for batch in args.batches:
        inputs = inputs_for(processor, batch, policy.device)
        length = int(inputs["attention_mask"].sum(dim=1).max())
        fast = vmodel.compiled_decoding(policy, -(-length // 64) * 64 + args.completion)  # as prompts.cache_length
        try:
            row = {**measure(policy, inputs, args.completion, fast, bound_ms), "prompt_tokens": length,
                   "cache_length": fast["max_cache_len"]}
        except torch.cuda.OutOfMemoryError as error:
            row = {"batch": batch, "error": f"out of memory: {str(error)[:200]}"}
        result["rows"].append(row)
        print("ROW", json.dumps(row), flush=True)
        if batch == args.batches[0] and "error" not in row:
            with mismatch.recording(policy):
                recorded = measure(policy, inputs, args.completion, fast, bound_ms)
            result["recorder"] = {"step_ms_off": row["step_ms"], "step_ms_on": recorded["step_ms"],
                                  "peak_reserved_gib_on": recorded["peak_reserved_gib"]}
            print("RECORDER", json.dumps(result["recorder"]), flush=True)
            if args.fused:
                try:
                    from vlrl.nf4_decode import fused_decode

                    with fused_decode(policy):
                        result["fused"] = measure(policy, inputs, args.completion, fast, bound_ms)
                except Exception as error:  # noqa: BLE001  (the table goes on without it; the reason is kept)
                    result["fused"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                print("FUSED", json.dumps(result["fused"]), flush=True)
        name.write_text(json.dumps(result, indent=2))
        del inputs
        torch.cuda.empty_cache()
    print("RESULT", name.name, json.dumps({r["batch"]: r.get("step_ms", r.get("error")) for r in result["rows"]}))


if __name__ == "__main__":
    main()
