"""vlrl: reinforcement learning of vision-language models (Qwen3-VL, GSPO) on one GPU, with auditable results.

Importing vlrl loads nothing heavy: no GPU, Unsloth or model is needed to `import vlrl` or `vlrl.rewards`.
"""

__version__ = "0.1.0"
