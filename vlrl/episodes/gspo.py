"""GSPO over episodes: groups of episodes from the same seed, one advantage per episode, every assistant turn trained
with it, in the context (images included) the turn was generated in.

    log = train(config, policy, processor, make_env, "runs/grid-tiny")   # -> train_log.jsonl, checkpoints/

Why a loop of its own and not TRL's: TRL 1.14.2's `rollout_func` returns prompt and completion token ids, but its
training pass restores the images of the dataset row (`images = dataset_images`), so a turn's new observation image
never reaches the forward pass; `environment_factory` runs the environment as tool calls (the model must emit Qwen
tool-call JSON, observations come back as tool messages) with no cap on images per message or in context and no
context measured with its image tokens. Neither carries a multi-turn visual context with one image per turn, our
caps and a per-episode advantage into the loss, so this module is a small, explicit GSPO step instead, using TRL's
recipe values (`vlrl.recipe.RECIPES`: clip range, advantage scaling, gradient clipping) and PEFT's adapter.

The objective, per step:
- a group is `num_generations` episodes of one seed; an episode's advantage is its return minus the group's mean
  (divided by the group's std under `scale_rewards = "group"`, the gspo-paper recipe); failed episodes (the
  environment raised) train nothing and stay out of the group's statistics;
- each assistant turn is one sequence: s = exp(mean over its tokens of log pi - log pi_old), the sequence-level
  ratio of GSPO, and its loss is -min(s A, clip(s, 1 - eps, 1 + eps_high) A) with its episode's A; the loss is the
  mean over the step's turns, on the reply tokens only (the observations are context, never targets);
- one update per rollout makes s = 1 (pi_old is the rollout policy); `[env] updates_per_rollout` > 1 reuses the
  rollout and the clip then acts.
Each turn is scored in exactly the context it was generated in: with the in-context image cap an earlier turn's
context is not a prefix of a later one's, so turns are separate sequences (cost grows with the square of the turn
count; sharing prefixes is an optimization for later). A forward pass holds at most `max_seq_length` tokens, padding
included (`passes`), and on a CUDA GPU the decoder layers recompute their activations in the backward pass
(gradient checkpointing, as TRL's GSPO does there): 16 turn sequences of a 16-turn Crafter episode in one pass,
without either, reached 137 GiB at the 2B shape on an H200.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

from vlrl.episodes.context import prompt_text
from vlrl.episodes.rollout import Episode, Settings, play, summary
from vlrl.progress import eta
from vlrl.prompts import mask_tokens, vision_token_ids
from vlrl.recipe import RECIPES

KEEP_CHECKPOINTS = 2


# --- advantages ------------------------------------------------------------------------------------------------------

def advantages(returns: list[float], group_size: int, *, scale: bool = False, valid=None) -> list[float | None]:
    """One advantage per episode: its return minus its group's mean (over valid episodes), divided by the group's
    std when `scale`; None for an invalid (failed) episode. Groups are `group_size` consecutive episodes.

    >>> advantages([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], 3)
    [0.6666666666666667, -0.3333333333333333, -0.3333333333333333, -0.6666666666666666, 0.33333333333333337, 0.33333333333333337]
    >>> advantages([1.0, 0.0, 5.0], 3, valid=[True, True, False])
    [0.5, -0.5, None]
    """
    valid = list(valid) if valid is not None else [True] * len(returns)
    out: list[float | None] = []
    for start in range(0, len(returns), group_size):
        group = [(r, v) for r, v in zip(returns[start:start + group_size], valid[start:start + group_size])]
        kept = [r for r, v in group if v]
        mean = sum(kept) / len(kept) if kept else 0.0
        std = math.sqrt(sum((r - mean) ** 2 for r in kept) / len(kept)) if kept else 0.0
        out += [((r - mean) / (std + 1e-4) if scale else r - mean) if v else None for r, v in group]
    return out


def turn_samples(episodes: list[Episode], advantages_: list, processor, settings: Settings) -> list[dict]:
    """Every assistant turn of the trained episodes as one sequence: its context exactly as generated (the
    conversation up to the turn, in-context cap applied), the reply's token ids and the episode's advantage."""
    from vlrl.episodes.context import cap_context

    samples = []
    for episode, advantage in zip(episodes, advantages_):
        if advantage is None:
            continue
        for t, ids in enumerate(episode.reply_ids):
            context, _ = cap_context(episode.messages[:2 + 2 * t], max_images=settings.max_images_in_context)
            text, images = prompt_text(processor, context)
            samples.append({"text": text, "images": images, "reply_ids": list(ids), "advantage": float(advantage),
                            "tokens": episode.turns[t]["context_tokens"] + len(ids)})
    return samples


def passes(samples: list[dict], max_tokens: int) -> list[list[dict]]:
    """Consecutive samples grouped into forward passes of at most `max_tokens` tokens, padding included (rows x the
    longest row), one sample at least: activation memory follows the tokens of a pass, not its turn count.

    >>> [[s["tokens"] for s in p] for p in passes([{"tokens": n} for n in (100, 300, 200, 900, 50)], 600)]
    [[100, 300], [200], [900], [50]]
    """
    out, current, longest = [], [], 0
    for sample in samples:
        widest = max(longest, sample["tokens"])
        if current and widest * (len(current) + 1) > max_tokens:
            out.append(current)
            current, widest = [], sample["tokens"]
        current.append(sample)
        longest = widest
    return out + ([current] if current else [])


# --- the loss --------------------------------------------------------------------------------------------------------

def reply_logprobs(policy, processor, samples: list[dict]):
    """Per-token log-probabilities of each sample's reply under `policy` (a list of 1-D tensors), computing the LM
    head only at reply positions, over the vocabulary the rollouts sampled from (vision tokens masked)."""
    import torch

    tokenizer = processor.tokenizer
    tokenizer.padding_side = "right"
    flat = [im for s in samples for im in s["images"]]
    prompts = processor(text=[s["text"] for s in samples], images=flat or None, return_tensors="pt", padding=True)
    lengths = prompts["attention_mask"].sum(dim=1).tolist()
    rows = [prompts["input_ids"][i, :n].tolist() + s["reply_ids"] for i, (n, s) in enumerate(zip(lengths, samples))]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id or 0
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    extra = {k: v for k, v in prompts.items() if k not in ("input_ids", "attention_mask")}
    if "mm_token_type_ids" in extra:  # per-token: the reply and the padding are text
        old = extra["mm_token_type_ids"]
        extra["mm_token_type_ids"] = torch.zeros_like(input_ids)
        for i, n in enumerate(lengths):
            extra["mm_token_type_ids"][i, :n] = old[i, :n]
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    device = next(policy.parameters()).device
    hidden = base.model(input_ids=input_ids.to(device), attention_mask=attention.to(device), use_cache=False,
                        **{k: v.to(device) for k, v in extra.items()}).last_hidden_state
    positions, targets = [], []
    for i, (n, s) in enumerate(zip(lengths, samples)):
        positions += [(i, n - 1 + j) for j in range(len(s["reply_ids"]))]  # the position before each reply token
        targets += s["reply_ids"]
    index = torch.tensor(positions, device=device)
    logits = mask_tokens(base.lm_head(hidden[index[:, 0], index[:, 1]]).float(), vision_token_ids(processor))
    logp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1)
    return list(torch.split(logp, [len(s["reply_ids"]) for s in samples]))


def gspo_turn_loss(logp, old_logp, advantage: float, epsilon: float, epsilon_high: float):
    """GSPO's clipped objective for one sequence (a turn), negated, and its ratio s = exp(mean(logp - old_logp)).

    >>> import torch
    >>> logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    >>> loss, ratio = gspo_turn_loss(logp, logp.detach(), 0.5, 0.2, 0.2)
    >>> loss.item(), ratio.item()
    (-0.5, 1.0)
    """
    import torch

    ratio = torch.exp((logp - old_logp).mean())
    return -torch.min(ratio * advantage, torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * advantage), ratio


def update(policy, processor, samples: list[dict], optimizer, *, recipe: str, max_grad_norm: float,
           updates: int = 1, max_tokens: int = 16384) -> dict:
    """`updates` optimizer steps on one rollout's turn samples (their mean GSPO loss), in forward passes of at most
    `max_tokens` tokens; returns loss, gradient norm and the share of clipped turns."""
    import torch

    r = RECIPES[recipe]
    params = [p for p in policy.parameters() if p.requires_grad]
    chunks = passes(samples, max_tokens)
    old = None
    if updates > 1:  # pi_old: the rollout policy's log-probabilities, fixed across the updates
        with torch.no_grad():
            old = [lp for chunk in chunks for lp in reply_logprobs(policy, processor, chunk)]
    total, clipped, grad_norm = 0.0, 0, 0.0
    policy.train()
    for _ in range(updates):
        total, clipped, k = 0.0, 0, 0
        for chunk in chunks:
            losses = []
            for lp, sample in zip(reply_logprobs(policy, processor, chunk), chunk):
                reference = old[k] if old is not None else lp.detach()
                loss, ratio = gspo_turn_loss(lp, reference, sample["advantage"], r["epsilon"], r["epsilon_high"])
                clipped += not (1 - r["epsilon"] <= ratio.item() <= 1 + r["epsilon_high"])
                losses.append(loss)
                k += 1
            chunk_loss = torch.stack(losses).sum() / len(samples)
            chunk_loss.backward()
            total += chunk_loss.item()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": grad_norm, "clip_ratio": clipped / max(1, len(samples))}


# --- the training loop -----------------------------------------------------------------------------------------------

def total_steps(config) -> int:
    """Optimizer steps: [training] max_steps, else enough for num_train_epochs passes over the training seeds."""
    t = config.training
    if t.max_steps > 0:
        return t.max_steps
    return max(1, math.ceil(config.env.train_seeds * t.num_train_epochs / groups_per_step(config)))


def groups_per_step(config) -> int:
    t = config.training
    return max(1, t.per_device_train_batch_size * t.gradient_accumulation_steps // t.num_generations)


def step_seeds(config, step: int, train_seeds: list[int]) -> list[int]:
    """The seeds of step `step` (1-based): the next groups of the training seeds in order, each `num_generations`
    times, so a resumed run plays the same episodes."""
    g = groups_per_step(config)
    chosen = [train_seeds[((step - 1) * g + j) % len(train_seeds)] for j in range(g)]
    return [seed for seed in chosen for _ in range(config.training.num_generations)]


def checkpoint_activations(policy) -> None:
    """On a CUDA GPU, the decoder layers recompute their activations in the backward pass (gradient checkpointing,
    as TRL's GSPO there); on the CPU it would only cost time. `vlrl.run_episodes` calls it at load, before any
    decoding: compiled decoding graphs guard on the flag, so turning it on between the baseline episodes and training
    would compile every cache length's graph again (at the 2B shape on an H200, the first step's 8 sampled episodes
    took 215 s and the 8 eval episodes after it 96 s; how much of that was compiling was not measured apart)."""
    if next(policy.parameters()).is_cuda:
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def train(config, policy, processor, make_env, run, train_seeds: list[int], settings: Settings, *, log=print) -> list:
    """GSPO over episodes into the run directory: train_log.jsonl (one row per step, written as it goes) and
    checkpoints/step-N (adapter, optimizer, scheduler), resumed from the latest one. Returns the step rows."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    from vlrl.recipe import gspo_values

    t = config.training
    steps = total_steps(config)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = (torch.optim.SGD(params, lr=t.learning_rate) if t.optim == "sgd"
                 else torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=0.0))
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps)
    done = _resume(policy, optimizer, schedule, run.checkpoints, log)
    if done >= steps and log is not None:
        log(f"training is done (step {done} of {steps}): nothing to train, the policy is that checkpoint's; "
            "train_log.jsonl holds the steps (a new run needs a new run directory)")
    checkpoint_activations(policy)
    max_grad_norm = gspo_values(t.recipe)["max_grad_norm"]
    scale = RECIPES[t.recipe]["scale_rewards"] == "group"
    rows = []
    first = time.time()
    for step in range(done + 1, steps + 1):
        torch.manual_seed(t.seed * 100_003 + step)  # the same step samples the same episodes after a resume
        started = time.time()
        episodes = play(policy, processor, make_env, step_seeds(config, step, train_seeds), settings,
                        batch_size=t.generation_batch_size)  # 0: the step's episodes all at once
        rolled = time.time()
        adv = advantages([e.total_return for e in episodes], t.num_generations, scale=scale,
                         valid=[e.status != "failed" for e in episodes])
        samples = turn_samples(episodes, adv, processor, settings)
        result = (update(policy, processor, samples, optimizer, recipe=t.recipe, max_grad_norm=max_grad_norm,
                         updates=config.env.updates_per_rollout, max_tokens=settings.max_seq_length)
                  if samples else {"loss": 0.0, "grad_norm": 0.0, "clip_ratio": 0.0})
        schedule.step()
        s = summary(episodes)
        row = {"step": step, "reward": s["return_mean"], "rewards/success/mean": s["success_rate"],
               "completions/turns_mean": s["length_mean"],
               "completions/invalid_actions": s["invalid_actions"], "truncated": s["truncated"],
               "failed": s["failed"], "failures": s["failures"], "dropped_images": s["dropped_images"],
               "turns_trained": len(samples), **result, "learning_rate": schedule.get_last_lr()[0],
               "rollout_seconds": round(rolled - started, 2), "update_seconds": round(time.time() - rolled, 2)}
        rows.append(row)
        with open(run.train_log, "a") as f:
            f.write(json.dumps(row) + "\n")
        if log is not None:
            log(f"step {step}/{steps}: return {s['return_mean']:.2f}, success {s['success_rate']:.0%}, "
                f"{len(samples)} turns, loss {result['loss']:+.4f}, rollout {row['rollout_seconds']} s, "
                f"update {row['update_seconds']} s, {eta(step - done, steps - done, time.time() - first)}")
        if step % t.save_steps == 0 or step == steps:
            _save(policy, optimizer, schedule, run.checkpoints, step)
    return rows


def _save(policy, optimizer, schedule, root: Path, step: int) -> None:
    """checkpoints/step-N, written whole or not at all (a temporary folder renamed), the oldest pruned."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict()}, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    final = root / f"step-{step}"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in _checkpoints(root)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)


def _checkpoints(root: Path) -> list[Path]:
    found = [p for p in Path(root).glob("step-*") if (p / "state.json").exists()] if Path(root).exists() else []
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def _resume(policy, optimizer, schedule, root: Path, log) -> int:
    """Loads the latest checkpoint's adapter, optimizer and scheduler; returns its step (0: none)."""
    found = _checkpoints(root)
    if not found:
        return 0
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    latest = found[-1]
    set_peft_model_state_dict(policy, load_file(str(latest / "adapter_model.safetensors")))
    state = torch.load(latest / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["scheduler"])
    step = json.loads((latest / "state.json").read_text())["step"]
    if log is not None:
        log(f"resumed from {latest} (step {step})")
    return step
