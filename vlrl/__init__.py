"""vlrl: reinforcement learning of vision-language models (Qwen3-VL, GSPO) on one GPU, with auditable results.

Importing vlrl loads nothing heavy: no GPU, Unsloth or model is needed to `import vlrl` or `vlrl.rewards`.
"""

__version__ = "0.1.0"


# Warnings of the libraries under vlrl that do not concern a vlrl user, silenced at their source (each library's own
# logger), by logger name -> words of the message, with the reason:
QUIET = {
    # bitsandbytes (imported by transformers and PEFT) on every model load: its optional `kernels` module for 4-bit
    # matmuls on CPU is missing; vlrl never runs 4-bit weights on a CPU
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward",
    # TRL on every GSPO run: dr_grpo sums token losses under sequence-level ratios; the recipe chooses it knowingly
    # (vlrl.recipe says why)
    "trl.trainer.grpo_trainer": "When using `importance_sampling_level='sequence'`",
    # transformers when training starts: the tokenizer's special tokens copied into the generation config, as meant
    "transformers.trainer_utils": "The tokenizer has new PAD/BOS/EOS tokens",
}


def _quiet_third_party() -> None:
    import logging

    class Quiet(logging.Filter):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

        def filter(self, record: logging.LogRecord) -> bool:
            return self.text not in record.getMessage()  # accelerate prefixes "[RANK 0] "

    for name, text in QUIET.items():
        logging.getLogger(name).addFilter(Quiet(text))


_quiet_third_party()
