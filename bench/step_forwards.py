"""Which forwards one GSPO step runs, on the tiny model on a CPU: vlrl's trainer (micro-batch 4, 16 decoded at once,
`[training] pass_tokens`) against plain TRL's (its defaults: micro-batch 8, 32 at once), the same 32 completions of
bench/gpu_engine.py's 512x512 items. Counts the language model's forwards (decoding, prefill, training: the rows and
width of each training pass) and the vision tower's, and times the step (issue 50 point 2: does vlrl's update run
more or wider passes than TRL's?).

    python bench/step_forwards.py --path vlrl --pass-tokens 6144 --completion 128
    python bench/step_forwards.py --path trl --completion 128
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import gpu_engine
    import torch

    from vlrl.model.loading import LoraSettings, load_model
    from vlrl.training.warmstart import ensure_tiny

    p = argparse.ArgumentParser()
    p.add_argument("--path", choices=("vlrl", "trl"), default="vlrl")
    p.add_argument("--pass-tokens", type=int, default=0)
    p.add_argument("--completion", type=int, default=128)
    p.add_argument("--out", default="/tmp/vlrl-step-forwards")
    a = p.parse_args()
    policy, processor = load_model(str(ensure_tiny(warm_start_steps=0)), load_in_4bit=False, max_seq_length=2048,
                                   lora=LoraSettings(r=16, alpha=16), backend="transformers")
    counts = {"language_model": 0, "vision": 0, "training": []}

    def language(module, args, kwargs):
        counts["language_model"] += 1
        if torch.is_grad_enabled():  # a training pass: its rows and width
            counts["training"].append(tuple(kwargs["inputs_embeds"].shape[:2]))

    def vision(*_):
        counts["vision"] += 1

    base = policy.get_base_model().model
    base.language_model.register_forward_pre_hook(language, with_kwargs=True)
    base.visual.register_forward_pre_hook(vision)
    args = argparse.Namespace(micro_batch=4, generation_batch=16, completion=a.completion, steps=1, warmup=0,
                              pass_tokens=a.pass_tokens, inputs=["1-image"])
    build = gpu_engine.vlrl_trainer if a.path == "vlrl" else gpu_engine.plain_trl_trainer
    trainer = build(args, policy, processor, gpu_engine.dataset(40), Path(a.out) / f"{a.path}-{a.pass_tokens}")
    start = time.perf_counter()
    trainer.train()
    print(f"{a.path} (pass_tokens {a.pass_tokens}): step {time.perf_counter() - start:.1f} s; forwards: "
          f"language model {counts['language_model']}, vision {counts['vision']}; training passes (rows, width): "
          f"{counts['training']}")


if __name__ == "__main__":
    main()
