"""Why the 8B Crafter run's adapter export failed its read-back check on an H200 (gap 2.28e-2 > 1e-2, the bf16
tolerance; bench/results/engine.md): the adapter read back beside the trained one, on the 8B shape with random
weights, with the base as bitsandbytes left it (NF4) and repacked to int8 (`vlrl.engine.weights`).

For each base: LoRA's B set to small random values (a trained adapter), then the probe's logits (`vlrl.export.probe`)
twice in a row (is one forward reproducible?), after a decode through the engine (does decoding leave state behind?),
and `vlrl.export.check_reload`'s gap (save, load beside, compare).

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
                                   lora=LoraSettings(r=16, alpha=16), backend="transformers")
    packed = None
    if fmt != "nf4":
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
        try:
            out.update(check_reload(policy, processor, tmp))
        except Exception as err:  # noqa: BLE001 - the failure is what this measures
            out["reload_error"] = str(err)[:300]
    return out


def main() -> None:
    from gpu_gspo import build_checkpoint

    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default="/tmp/ckpt/qwen3-vl-8b-random-bnb4")
    p.add_argument("--formats", nargs="+", default=["nf4", "int8"])
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
