"""The GSPO recipe as TRL arguments: `gspo_values()` (plain keyword arguments) and `gspo_config()` (a
`trl.GRPOConfig`), with the two objectives vlrl offers (`RECIPES`) and every field where TRL's and Unsloth's
defaults differ stated explicitly (`BACKEND_DEFAULTS`), so a run means the same on both backends.

    >>> gspo_values()["importance_sampling_level"]
    'sequence'
"""

from __future__ import annotations

from vlrl.base.distributed import sharded_launch
from vlrl.base.errors import ConfigError

# The two objectives, side by side (docs/training.md explains the difference). Every value is passed explicitly,
# so TRL and Unsloth, whose defaults differ (BACKEND_DEFAULTS), optimize the same objective.
RECIPES = {
    # The recipe this project reproduces (Unsloth's GSPO notebook for Qwen-VL): sequence-level ratios, Dr. GRPO loss.
    "gspo": {
        "importance_sampling_level": "sequence",  # GSPO: one importance ratio per sequence
        # dr_grpo sums token losses over a constant (max_completion_length): TRL warns that under sequence-level
        # ratios this weights each sequence by its length; "gspo-paper" averages per sequence instead
        "loss_type": "dr_grpo",
        # Dr. GRPO: advantages are not divided by the group std. Unsloth forces this for dr_grpo; TRL's default
        # "group" would scale, so the two backends would train differently unless it is stated
        "scale_rewards": "none",
        "beta": 0.0,  # no KL term and no reference model: saves a forward pass and memory
        "epsilon": 0.2, "epsilon_high": 0.2,  # TRL's default clip range, stated (Unsloth widens epsilon_high for dapo)
        "mask_truncated_completions": False,  # cut-off completions still train (the recipe)
    },
    # TRL's documented GSPO setting (paper_index: "Group Sequence Policy Optimization"), GSPO paper v2 section 5.1.
    "gspo-paper": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",  # each sequence's token losses are averaged: the per-sequence objective of the paper
        "scale_rewards": "group",  # the paper's group-normalized advantage (mean and std of each prompt's group)
        "beta": 0.0,  # "GSPO set KL regularization to zero"
        "epsilon": 3e-4, "epsilon_high": 4e-4,  # sequence ratios sit near 1: the paper's clip range is 1e-4 wide
        "mask_truncated_completions": False,
        # and each rollout is split into mini-batches, one optimizer step each (see gspo_values)
    },
}

WEIGHT_DECAY = 0.1  # Unsloth's GSPO notebook value (TRL 0.0, Unsloth 0.001: stated, so both agree)
WARMUP_STEPS = 0.1  # a share of the steps (transformers 5 reads a value below 1 so); Unsloth's default

# The recipe's values that a run file's [training] can also set: the one place each default lives (the section's
# dataclass, `vlrl.config.sections.TrainingConfig`, reads them here; a preset states only what it changes).
TRAINING_DEFAULTS = {
    "learning_rate": 5e-6,  # RL on a 4-bit base: small steps keep the policy near the instruct model
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,  # 8 x 4 = 32 completions per optimizer step = 8 prompts x 4 generations
    "num_generations": 4,  # the group each advantage is relative to
    "max_completion_length": 1024,  # room for the reasoning block; longer ones are cut (and counted as clipped)
    "num_train_epochs": 1.0,
    "temperature": 1.0,  # sample from the policy itself: the importance ratios assume it
    "seed": 0,  # TRL 42, Unsloth 3407: stated, so both draw the same samples
    "logging_steps": 1,  # every step into train_log.jsonl
    "report_to": "none",  # no experiment tracker unless asked ([training] report_to)
}

# Where TRL 1.14.2's GRPOConfig and Unsloth 2026.10.9's (UnslothGRPOConfig, which replaces it once unsloth is
# imported) disagree by default: field -> (TRL default, Unsloth default). `gspo_values` sets every one of them, so a
# run file means the same on both backends; tests check the TRL column against the installed TRL, and
# `bench/unsloth_defaults.py` checks the Unsloth column on a GPU machine. None in the Unsloth column is a sentinel
# that Unsloth resolves itself, as noted.
BACKEND_DEFAULTS = {
    "learning_rate": (1e-6, 5e-5),
    "per_device_train_batch_size": (8, 4),
    "gradient_accumulation_steps": (1, 2),
    "weight_decay": (0.0, 0.001),
    "warmup_steps": (0, 0.1),
    "seed": (42, 3407),
    "optim": ("adamw_torch_fused", "adamw_8bit"),
    "logging_steps": (10, 1),
    "logging_nan_inf_filter": (True, False),
    "beta": (0.0, None),  # Unsloth: 0.0 for dapo / dr_grpo, 0.001 for any other loss_type (grpo included)
    "loss_type": ("dapo", None),  # Unsloth: None -> "dapo", with a note
    "scale_rewards": ("group", "group"),  # same default, but Unsloth turns "group" into "none" when dr_grpo
    "mask_truncated_completions": (False, None),  # Unsloth: None -> False, but True for an explicit loss "dapo"
    "epsilon_high": (None, None),  # both None -> epsilon, but Unsloth sets 0.28 for "dapo", 5.0 for "cispo"
    "vllm_importance_sampling_correction": (True, False),  # only acts with use_vllm; vlrl generates without vLLM
    "router_aux_loss_coef": (None, 0.0),  # TRL: the model's own coefficient; 0.0 for dense Qwen-VL
}


def gspo_values(recipe: str = "gspo", **overrides) -> dict:
    """The GSPO recipe as plain `GRPOConfig` keyword arguments (what `gspo_config` builds); keyword overrides win.

    >>> v = gspo_values()
    >>> v["loss_type"], v["scale_rewards"], v["importance_sampling_level"], v["max_grad_norm"]
    ('dr_grpo', 'none', 'sequence', 0.1)
    >>> v = gspo_values("gspo-paper", gradient_accumulation_steps=4)
    >>> v["loss_type"], v["epsilon"], v["gradient_accumulation_steps"], v["steps_per_generation"]
    ('grpo', 0.0003, 1, 4)
    """
    import torch

    from vlrl.grammar.rewards import REWARD_WEIGHTS

    if recipe not in RECIPES:
        raise ConfigError(f"recipe {recipe!r} is unknown; choose one of {', '.join(RECIPES)}.")
    cuda = torch.cuda.is_available()
    machine = machine_choices()
    values = dict(
        output_dir="runs/gspo",
        **TRAINING_DEFAULTS,
        lr_scheduler_type="cosine",
        warmup_steps=WARMUP_STEPS,  # its first step runs at learning rate 0; [training] warmup_steps sets another
        optim=machine["optim"],  # the 8-bit AdamW where it can run (`machine_choices` says why, in the run's log)
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=0.1,  # RL gradients are noisy; clip hard
        reward_weights=list(REWARD_WEIGHTS),  # R = 0.3 * format + 1.0 * correctness
        logging_nan_inf_filter=False,  # a NaN loss must show in the log, not be averaged away
        router_aux_loss_coef=0.0,  # dense models: no MoE auxiliary loss (TRL resolves 0.0; Unsloth sets 0.0)
        vllm_importance_sampling_correction=False,  # vlrl generates with the policy itself, no vLLM mismatch
        save_only_model=False,  # checkpoints keep optimizer, scheduler and RNG state, so --resume is exact
        trackio_static_space_id=False,  # with trackio: never publish the metrics as a Space on the Hub; they stay local
        bf16=machine["precision"] == "bf16",
        fp16=False,
        gradient_checkpointing=cuda,  # saves activation memory on GPU; on CPU (tiny model) it only costs time
        # DDP (several processes): every LoRA weight takes part in each forward, so DDP need not search the graph for
        # unused ones each step (transformers' default without gradient checkpointing searches, and warns)
        ddp_find_unused_parameters=False,
        use_cpu=not cuda,
        **RECIPES[recipe],
    )
    values.update(overrides)
    if recipe == "gspo-paper" and not {"steps_per_generation", "generation_batch_size"} & set(overrides):
        # The paper splits each rollout into mini-batches, one optimizer step each, so the sequence ratios (and the
        # clip range) act on slightly off-policy data. Keep the rollout size (batch x accumulation) and make each
        # accumulation slice its own optimizer step, as TRL's documented setting does (accumulation 1, 4 steps).
        values["steps_per_generation"] = values["gradient_accumulation_steps"]
        values["gradient_accumulation_steps"] = 1
    return values


def gspo_config(output_dir: str = "runs/gspo", recipe: str = "gspo", **overrides):
    """The GSPO recipe as a `trl.GRPOConfig` (Unsloth's subclass once unsloth is imported); keyword overrides win.

    Defaults: learning_rate 5e-6, cosine schedule, adamw_8bit (adamw_torch without CUDA/bitsandbytes), batch 8 x 4
    accumulation, 4 generations, 1024 completion tokens, 1 epoch, max_grad_norm 0.1, sequence-level importance
    sampling, loss "dr_grpo", reward weights 0.3 / 1.0; every field in `BACKEND_DEFAULTS` stated explicitly.
    `recipe="gspo-paper"` is TRL's documented GSPO setting instead (loss "grpo", clip 3e-4 / 4e-4).

    >>> args = gspo_config("/tmp/vlrl-doctest")
    >>> args.loss_type, args.beta, args.mask_truncated_completions, args.num_generations
    ('dr_grpo', 0.0, False, 4)
    """
    from trl import GRPOConfig

    return GRPOConfig(**gspo_values(recipe, output_dir=output_dir, **overrides))


def machine_choices(optim: str = "", *, cuda: bool | None = None, bf16: bool | None = None,
                    bitsandbytes: bool | None = None, sharded: bool | None = None) -> dict:
    """The optimizer and the precision the recipe takes on this machine, each with its reason: the run says both in
    its first lines (`machine_line`), since the same run file trains differently on a CPU, an old GPU or a GPU
    without bitsandbytes. Unset arguments are read from the machine.

    Args:
        optim: [training] optim; "" is the recipe's AdamW (8-bit where it can run).
        cuda, bf16, bitsandbytes, sharded: a CUDA GPU, bf16 support on it, bitsandbytes importable, an FSDP or
            ZeRO-3 launch.

    Returns:
        {"optim", "optim_reason", "precision" ("bf16" or "fp32"), "precision_reason"}.

    >>> c = machine_choices(cuda=False)
    >>> c["optim"], c["precision"], c["precision_reason"]
    ('adamw_torch', 'fp32', 'no CUDA GPU')
    >>> machine_choices(cuda=True, bf16=True, bitsandbytes=False, sharded=False)["optim_reason"]
    "bitsandbytes is not installed, which the 8-bit AdamW needs: pip install 'vlrl[gpu]'"
    """
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    bf16 = (cuda and torch.cuda.is_bf16_supported()) if bf16 is None else bf16
    if optim:
        chosen, why = optim, "[training] optim"
    elif not cuda:
        chosen, why = "adamw_torch", "no CUDA GPU, which bitsandbytes' 8-bit AdamW runs on"
    elif not (_has_bitsandbytes() if bitsandbytes is None else bitsandbytes):
        chosen, why = "adamw_torch", ("bitsandbytes is not installed, which the 8-bit AdamW needs: "
                                      "pip install 'vlrl[gpu]'")
    elif sharded_launch() if sharded is None else sharded:
        # bitsandbytes' update cannot take sharded (DTensor) parameters: failed on 2 H200s (bench/results/multi_gpu.md)
        chosen, why = "adamw_torch", "an FSDP / ZeRO-3 launch, whose sharded parameters the 8-bit AdamW cannot update"
    else:
        chosen, why = "adamw_8bit", "8-bit AdamW states (bitsandbytes): about 6 bytes less per trainable parameter"
    if not cuda:
        precision, precision_why = "fp32", "no CUDA GPU"
    elif bf16:
        precision, precision_why = "bf16", "the GPU computes in bf16 (mixed precision; the LoRA weights stay fp32)"
    else:
        precision, precision_why = "fp32", "the GPU has no bf16 (before Ampere); the recipe never trains in fp16"
    return {"optim": chosen, "optim_reason": why, "precision": precision, "precision_reason": precision_why}


def machine_line(choices: dict) -> str:
    """`machine_choices` as the run's log line.

    >>> print(machine_line(machine_choices(cuda=False)))
    training: optimizer adamw_torch (no CUDA GPU, which bitsandbytes' 8-bit AdamW runs on); precision fp32 (no CUDA GPU)
    """
    return (f"training: optimizer {choices['optim']} ({choices['optim_reason']}); precision {choices['precision']} "
            f"({choices['precision_reason']})")


def _has_bitsandbytes() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return False
    return True
