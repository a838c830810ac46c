"""The model layer: loading a policy (`loading`: backends, 4-bit, LoRA targets per family, adapters), the tiny offline
models (`tiny`), the conversation a row becomes (`prompts`: chat template, the processor's tensors), its length in
tokens (`lengths`: the length filter) and the vision placeholders decoding never produces (`vision_tokens`).

It may import `vlrl.base` and `vlrl.grammar`. The decoding engine (`vlrl.engine`) sits on top of it. The loading
functions are re-exported here, so `vlrl.model.load_model` is the public name.
"""

from vlrl.model.loading import (
    BACKENDS,
    FAMILIES,
    LANGUAGE_TARGETS,
    QWEN35_LINEAR_ATTENTION,
    LoraSettings,
    activate_backend,
    add_lora,
    backend_of,
    bnb_4bit_config,
    choose_backend,
    describe,
    environment,
    family_of,
    load_adapter,
    load_model,
    lora_target_regex,
    require_adapter,
    trainable_summary,
)

__all__ = [
    "BACKENDS", "FAMILIES", "LANGUAGE_TARGETS", "QWEN35_LINEAR_ATTENTION", "LoraSettings", "activate_backend",
    "add_lora", "backend_of", "bnb_4bit_config", "choose_backend", "describe", "environment", "family_of",
    "load_adapter", "load_model", "lora_target_regex", "require_adapter", "trainable_summary",
]
