"""Why 8B adapter exports failed their read-back check on an H200: the Crafter run's on the int8 base (gap 2.28e-2 >
1e-2, the bf16 tolerance; bench/results/engine.md) and vlrl on Unsloth's (3.80e-2; bench/results/unsloth.md). The 8B
shape with random weights, the base as bitsandbytes left it (NF4), repacked to int8 (`vlrl.engine.weights`), or
loaded through Unsloth (`unsloth`).

For each base: LoRA's B set to small random values (a trained adapter), then the probe's logits (`vlrl.export.probe`)
twice in a row (is one forward reproducible?), after a decode through the engine (does decoding leave state behind?),
the gap of the files loaded beside the trained adapter under another name (`beside_gap`, the check before
2026-11-29), and `vlrl.export.check_reload`'s (the files read into the trained adapter's own layers).

    python bench/gpu_reload_gap.py --out $OUT/reload
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(checkpoint: str, fmt: str) -> dict:
    import torch

    from vlrl import engine
    from vlrl.export.adapter import check_reload
    from vlrl.export.probe import logits_gap, probe_inputs, probe_logits
    from vlrl.model.loading import LoraSettings, load_model

    policy, processor = load_model(checkpoint, load_in_4bit=True, max_seq_length=2048,
                                   lora=LoraSettings(r=16, alpha=16),
                                   backend="unsloth" if fmt == "unsloth" else "transformers")
    packed = None
    if fmt == "int8":
        from vlrl.engine.weights import pack_for_decoding

        packed = pack_for_decoding(policy, fmt)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    inputs = probe_inputs(processor)
    first, second = probe_logits(policy, inputs), probe_logits(policy, inputs)
    decoding = engine.decoding_for(policy, processor, max_new_tokens=16, temperature=1.0)
    engine.complete(policy, processor, ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"] * 4, [[]] * 4,
                    decoding)
    after = probe_logits(policy, inputs)
    out = {"format": fmt, "packed": packed and {k: packed[k] for k in ("format", "backend", "layers") if k in packed},
           "repeat_gap": logits_gap(first, second), "after_decode_gap": logits_gap(first, after),
           "logit_max": float(first.abs().max())}
    with tempfile.TemporaryDirectory() as tmp:
        policy.save_pretrained(tmp)
        out["beside"] = beside_gap(policy, inputs, first, tmp)
        try:
            out.update(check_reload(policy, processor, tmp))
        except Exception as err:  # noqa: BLE001 - the failure is what this measures
            out["reload_error"] = str(err)[:300]
    return out


def beside_gap(policy, inputs, reference, adapter_dir: str) -> dict:
    """The files loaded beside the trained adapter under another name, its logits against the trained ones: the gap,
    the dtypes of both adapters' LoRA weights, and the gap again once the beside copy holds the trained tensors
    themselves (so what is left is the path, not the files)."""
    from vlrl.export.probe import logits_gap, probe_logits

    active, name = policy.active_adapter, "beside"
    policy.load_adapter(adapter_dir, adapter_name=name)
    try:
        policy.set_adapter(name)
        params = dict(policy.named_parameters())
        pairs = [(k, k.replace(f".{name}.", f".{active}.")) for k in params if f".{name}." in k]
        out = {"gap": logits_gap(reference, probe_logits(policy, inputs)),
               "dtypes": sorted({f"{params[b].dtype}->{params[a].dtype}" for a, b in pairs}),
               "tensors_equal": all(bool((params[a].float() == params[b].float()).all()) for a, b in pairs)}
        for a, b in pairs:
            params[a].data.copy_(params[b].data)
        out["gap_with_trained_tensors"] = logits_gap(reference, probe_logits(policy, inputs))
    except Exception as err:  # noqa: BLE001 - a failure is a measurement here
        out = {"error": f"{type(err).__name__}: {err}"[:300]}
    finally:
        policy.set_adapter(active)
        policy.delete_adapter(name)
    return out


def main() -> None:
    if "unsloth" in sys.argv:
        import unsloth  # noqa: F401  (Unsloth patches transformers and PEFT only when imported first)
    from gpu_gspo import build_checkpoint

    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default="/tmp/ckpt/qwen3-vl-8b-random-bnb4")
    p.add_argument("--formats", nargs="+", default=["nf4", "int8"], help="nf4, int8, unsloth (alone: one process)")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results") + "/reload")
    args = p.parse_args()
    if not Path(args.checkpoint).exists():
        args.checkpoint = str(build_checkpoint("8b", Path("/tmp/vlrl-bench")))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for fmt in args.formats:
        rows.append(measure(args.checkpoint, fmt))
        print("RELOAD", json.dumps(rows[-1], default=str), flush=True)
    (Path(args.out) / "reload_gap.json").write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
