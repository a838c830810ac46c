"""GSPO over episodes inside TRL's GRPOTrainer: the trainer that single-turn runs use, with episodes for rollouts.

An episode run's training data is its training seeds (`seed_dataset`). TRL's sampler hands each process its share of a
step's seeds, every seed `num_generations` times (a group); `EpisodeRollouts` replaces only the rollout: it plays those
episodes (`vlrl.episodes.rollout.play`, the decoding engine recording each reply token's log-prob), gives each episode
its return as reward and its group's advantage by TRL's own rule (`group_advantages`: the recipe's `scale_rewards`,
failed episodes out of the statistics), and turns every assistant turn of the kept episodes into one row of TRL's batch:
its context exactly as the model took it (token ids, images included, the in-context cap applied) as the prompt, the
reply's token ids as the completion, the episode's advantage. The forward that scores the rows is one per segment of
turns whose contexts extend each other (`vlrl.episodes.scoring`), not one per turn; what it gives each reply token is
what the turn's own forward would. Everything after that is TRL's and the recipe's: the loss type and its reduction, the
sequence-level ratio (one sequence per turn), clipping, the optimizer, schedule, warmup and weight decay, gradient
clipping, `num_iterations` ([env] updates_per_rollout), checkpoints and exact resume, trackers, `accelerate launch`; and
vlrl's trainer services (`vlrl.training.train.build_trainer`): train_log.jsonl, the degeneration monitor, the rollout/training
mismatch and its correction, the GSPO loss (`vlrl.training.loss`).

One thing TRL's batch cannot do is bound a forward pass's memory by tokens: a step's turns vary in number and length (a
16-turn Crafter episode is 16 rows of ~2,000 tokens). So each micro-batch (whole segments, about as many turns in each)
is split into passes of at most `pass_tokens` tokens (padding included), each pass's loss computed by the trainer's
`policy_loss` (`vlrl.training.loss.gspo_loss`) with a weight that makes the passes add up to the micro-batch's loss
under the recipe's reduction (`pass_weight`), the gradients of all but the last pass accumulated without a cross-process sync. Under several
processes every process runs the same number of passes (shorter lists padded with zero-weight passes), as TRL's loss
takes part in collective calls.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch
from accelerate.utils import send_to_device

from vlrl import engine
from vlrl.base.errors import ConfigError, EnvError
from vlrl.episodes import scoring
from vlrl.episodes.rollout import play, slots, summary
from vlrl.training import dynamic_sampling as redraw
from vlrl.training.loss import REDUCTIONS


def seed_dataset(seeds: list[int]):
    """The training seeds as the trainer's data set: one row per seed, with a prompt only because TRL's data
    handling expects one (the episode's real context comes from its environment)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"episode seed {s}"}], "seed": int(s)}
                              for s in seeds])


def episode_return(completions, episode_return=None, **_):
    """The reward TRL knows an episode run by: each episode's return, summed over its turns (NaN: failed)."""
    return [float(r) for r in episode_return] if episode_return is not None else [math.nan] * len(completions)


def group_advantages(returns: torch.Tensor, group: int, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's advantage rule (GRPOTrainer, "sum_then_normalize") over episode returns: the return minus its group's
    mean, divided by the group's std ("group") or the batch's ("batch") unless "none"; a NaN return (a failed
    episode) stays out of the statistics and gets advantage NaN. Also returns which groups' returns are all equal.

    >>> adv, flat = group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2, "none")
    >>> adv.tolist(), flat.tolist()
    ([0.5, -0.5, 0.0, 0.0], [False, True])
    >>> group_advantages(torch.tensor([1.0, 0.0, float("nan"), 3.0]), 2, "none")[0].tolist()
    [0.5, -0.5, nan, 0.0]
    >>> [round(a, 2) for a in group_advantages(torch.tensor([1.0, float("nan"), 0.0, 2.0]), 2, "group")[0].tolist()]
    [0.0, nan, -0.71, 0.71]
    """
    from trl.trainer.utils import nanstd

    grouped = returns.view(-1, group)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group)
    if scale == "batch":
        std = nanstd(returns).expand_as(returns) if returns.numel() > 1 else torch.zeros_like(returns)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(group) if group > 1 else torch.zeros_like(returns)
    std = torch.nan_to_num(std, nan=0.0)  # one finite return in a group (or batch): no spread, so advantage 0
    advantages = returns - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return advantages, redraw.flat_groups(returns, group)


def turn_rows(episodes, advantages: list[float], dropped: dict[str, int] | None = None) -> list[dict]:
    """Every assistant turn of the episodes with a finite advantage, as one row: which episode it is of, its context
    as the model took it (`prompt`: `token_types.Tokenized`), the reply's ids and sampled log-probs, the advantage.
    The turns left out are counted in `dropped` by why: `failed_episode` (its episode failed, so it has no return
    and no advantage), `empty_reply` (a reply of no tokens, nothing to score).

    >>> from types import SimpleNamespace
    >>> episode = SimpleNamespace(reply_ids=[[1], [], [2]], reply_logps=[], contexts=[None] * 3)
    >>> dropped = {}
    >>> len(turn_rows([episode, episode], [0.5, float("nan")], dropped)), dropped
    (2, {'empty_reply': 1, 'failed_episode': 3})
    """
    rows = []
    dropped = {} if dropped is None else dropped
    for e, (episode, advantage) in enumerate(zip(episodes, advantages)):
        if not math.isfinite(advantage):
            dropped["failed_episode"] = dropped.get("failed_episode", 0) + len(episode.reply_ids)
            continue
        for t, ids in enumerate(episode.reply_ids):
            if not ids:
                dropped["empty_reply"] = dropped.get("empty_reply", 0) + 1
                continue
            logps = episode.reply_logps[t] if t < len(episode.reply_logps) else None
            rows.append({"episode": e, "prompt": episode.contexts[t], "reply_ids": list(ids), "logps": logps,
                         "advantage": float(advantage)})
    return rows


def passes(segments: list[list[dict]], max_tokens: int) -> list[list[list[dict]]]:
    """Consecutive segments (`vlrl.episodes.scoring.segments`) grouped into forward passes of at most `max_tokens`
    tokens (each segment's forward right-padded to the pass's longest), one segment at least.

    >>> from vlrl.engine.token_types import Tokenized
    >>> seg = lambda p, r: [{"prompt": Tokenized([0] * p), "reply_ids": [0] * r}]
    >>> chunks = passes([seg(90, 10), seg(280, 20), seg(150, 50), seg(800, 100)], 600)
    >>> [[len(s[0]["reply_ids"]) for s in p] for p in chunks]
    [[10, 20], [50], [100]]
    """
    out, current, width = [], [], 0
    for segment in segments:
        wider = max(width, scoring.tokens(segment))
        if current and wider * (len(current) + 1) > max_tokens:
            out.append(current)
            current, wider = [], scoring.tokens(segment)
        current.append(segment)
        width = wider
    return out + ([current] if current else [])


def split_turns(segments: list[list[dict]], parts: int) -> list[list[list[dict]]]:
    """`segments` in `parts` consecutive chunks of whole segments with about as many turns each (TRL splits a
    generation batch into equal micro-batches; a segment is never cut).

    >>> [[len(s) for s in c] for c in split_turns([[0] * 4, [0], [0], [0] * 2], 2)]
    [[4], [1, 1, 2]]
    >>> [len(c) for c in split_turns([[0]], 2)]
    [1, 0]
    """
    total = sum(len(s) for s in segments)
    out, start, done = [], 0, 0
    for k in range(parts):
        end = start
        # a chunk takes each next segment whose middle turn falls within its share of the turns (at least one
        # segment; the last chunk takes the rest), compared in integers: (done + len / 2) / total <= (k + 1) / parts
        while end < len(segments) and (end == start or k == parts - 1
                                       or (2 * done + len(segments[end])) * parts <= 2 * total * (k + 1)):
            done += len(segments[end])
            end += 1
        out.append(segments[start:end])
        start = end
    return out


def pass_weight(loss_type: str, rows: int, tokens: int, micro_rows: int, micro_tokens: int) -> float:
    """What a pass's loss (over the pass alone) is multiplied by so that the passes of a micro-batch add up to the
    loss over the whole micro-batch: by the share of its rows, of its tokens, or 1 for a count every pass shares
    (`vlrl.training.loss.REDUCTIONS`).

    >>> pass_weight("dr_grpo", 2, 30, 8, 100), pass_weight("bnpo", 2, 30, 8, 100), pass_weight("dapo", 2, 30, 8, 100)
    (0.25, 0.3, 1.0)
    """
    reduction = REDUCTIONS.get(loss_type)
    if reduction is None:
        raise ConfigError(f"loss type {loss_type!r}: vlrl's loss does not compute it, so an episode run cannot split "
                          f"its micro-batches into passes; use one of {', '.join(REDUCTIONS)}.")
    if reduction == "rows":
        return rows / max(1, micro_rows)
    return tokens / max(1, micro_tokens) if reduction == "tokens" else 1.0


class EpisodeRollouts:
    """Mixed into vlrl's trainer (`vlrl.training.trl_bridge.trainer_class`, inside `RolloutMismatch`): rollouts are
    whole episodes, each turn a row of the batch. `vlrl.training.train.build_trainer` gives it the environment, the
    play settings, the episodes played at once and the pass budget."""

    make_env = None  # a callable returning a fresh environment
    play_settings = None  # `vlrl.episodes.context.Settings`
    episodes_at_once: int = 0  # 0: a process's whole share of the step at once
    pass_tokens: int = 16384
    episode_log = None
    degeneration_monitor = None
    collapse_monitor = None  # `vlrl.training.collapse.CollapseMonitor`: each episode's actions, the first draw's
    _played_tokens = 0  # reply tokens generated this step, redraws included
    _merged = None  # the pass being scored: its segments' forward (`vlrl.episodes.scoring.merged_inputs`)
    dynamic_sampling = 0  # more draws a step for groups whose returns are all equal (`vlrl.training.dynamic_sampling`)

    def step_inputs(self, generation_batch):
        if not self.model.training:
            raise ConfigError("an episode run's trainer has no evaluation loop: its evals are `vlrl.run_episodes`'.")
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self.micro_step % generate_every == 0 or self.buffered_batches is None:
            self.buffered_batches = self._play_and_batch(generation_batch)
        return self.buffered_batches[self.micro_step % self.args.steps_per_generation]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The micro-batch's loss, pass by pass, each weighted by its `pass_weight` in the loss: every pass but the
        last is backpropagated here, without a sync of the gradients across processes; the last one's loss is
        returned for the trainer's own backward."""
        earlier = 0.0
        self._more_passes = True  # the mismatch metric is one value per step: summed until the last pass
        try:
            for chunk, weight in inputs["passes"][:-1]:
                with self.accelerator.no_sync(model):
                    loss = super().compute_loss(model, {**chunk, "pass_weight": weight})
                    self._pass_backward(loss, num_items_in_batch)
                earlier += loss.detach()
        finally:
            self._more_passes = False
        chunk, weight = inputs["passes"][-1]
        return super().compute_loss(model, {**chunk, "pass_weight": weight}) + earlier

    def _pass_backward(self, loss, num_items_in_batch) -> None:
        """The trainer's own backward step for a loss (`transformers.Trainer.training_step`'s scaling)."""
        if (not self.model_accepts_loss_kwargs or num_items_in_batch is None) and self.compute_loss_func is None:
            loss = loss / self.current_gradient_accumulation_steps
        self.accelerator.backward(loss)

    # --- scoring: one forward per segment -----------------------------------------------------------------------------

    def policy_loss(self, model, inputs):
        self._merged = inputs.get("merged")
        try:
            return super().policy_loss(model, inputs)
        finally:
            self._merged = None

    def token_logps(self, model, *args, **kwargs):
        """TRL's forward over prompt + completion rows, replaced while a pass is scored: its segments' forward gives
        the same log-probs in the same layout (the rows' prompts are placeholders then)."""
        if self._merged is None:
            return super().token_logps(model, *args, **kwargs)
        return (*self._merged_logps(model, kwargs.get("compute_entropy", False)), None)

    def _merged_logps(self, model, compute_entropy: bool):
        merged = self._merged

        def score(module):
            return scoring.reply_logps(module, merged, merged["reply_mask"], temperature=self.temperature,
                                       suppressed=self.suppressed_token_ids, autocast=self.accelerator.autocast,
                                       compute_entropy=compute_entropy, chunked=self.chunked_logps)

        return self.on_unwrapped(model, score)

    # --- one rollout ------------------------------------------------------------------------------------------------

    def _play_and_batch(self, generation_batch: list[dict]) -> list[dict]:
        self._played_tokens = 0
        episodes = self._play([int(row["seed"]) for row in generation_batch])
        returns, mine, flat = self._advantages(episodes)
        self._log_rollout(episodes, returns, flat)  # the step's samples: its first draw (`vlrl.training.dynamic_sampling`)
        if self.degeneration_monitor is not None:
            self.degeneration_monitor.observe([r.get("reply", "") for e in episodes for r in e.turns],
                                              [ids for e in episodes for ids in e.reply_ids])
        if self.collapse_monitor is not None:  # distinct action sequences
            self.collapse_monitor.observe([tuple(tuple(turn.get("actions", ())) for turn in e.turns) for e in episodes])
        if self.dynamic_sampling:
            episodes, mine = self._redraw(episodes, mine, flat)
        played = torch.tensor([float(self._played_tokens)], device=self.accelerator.device)
        self.log_metric("episodes/generated_tokens", self.accelerator.reduce(played, "sum").item())
        dropped = {}
        rows = turn_rows(episodes, mine, dropped)
        self._log_turns(rows, dropped)
        return self._micro_batches(rows)

    def _log_turns(self, rows: list[dict], dropped: dict[str, int]) -> None:
        """What the step trains on, summed over processes: its turns, those left out by why (`turn_rows`), and those
        in the batch but masked because their reply was cut at the token budget (`mask_truncated_completions`)."""
        ends = {*self.eos_token_ids, self.processing_class.tokenizer.pad_token_id}
        truncated = sum(r["reply_ids"][-1] not in ends for r in rows) if self.mask_truncated_completions else 0
        counts = torch.tensor([len(rows), dropped.get("failed_episode", 0), dropped.get("empty_reply", 0), truncated],
                              dtype=torch.float64, device=self.accelerator.device)
        trained, failed, empty, masked_cut = self.accelerator.reduce(counts, reduction="sum").tolist()
        self.log_metric("episodes/turns_trained", trained)
        self.log_metric("episodes/turns_dropped/failed_episode", failed)
        self.log_metric("episodes/turns_dropped/empty_reply", empty)
        self.log_metric("episodes/turns_masked/truncated", masked_cut)

    def _play(self, seeds: list[int]) -> list:
        settings = replace(self.play_settings, record_logps=True)
        started = time.perf_counter()
        session = engine.Session(slots(len(seeds), self.episodes_at_once))
        with self.policy_for_generation() as policy:
            episodes = play(policy, self.processing_class, self.make_env, seeds, settings,
                            batch_size=self.episodes_at_once, decoding=self.rollout_decoding, session=session)
        self._rollout_seconds += time.perf_counter() - started  # the step's `rollout_time` (`vlrl.training.mismatch`)
        self.add_decode_parts(session.prefill_s, session.decode_s, session.decode_steps)
        self._played_tokens += sum(len(ids) for e in episodes for ids in e.reply_ids)
        return episodes

    def _advantages(self, episodes) -> tuple[torch.Tensor, list[float], torch.Tensor]:
        """Every process's returns (gathered), this process's episodes' advantages, and which groups are flat."""
        local = torch.tensor([e.total_return if e.status != "failed" else math.nan for e in episodes],
                             dtype=torch.float32, device=self.accelerator.device)
        returns = self.accelerator.gather(local)
        advantages, flat = group_advantages(returns, self.num_generations, self.scale_rewards)
        start = self.accelerator.process_index * len(episodes)
        return returns, advantages[start:start + len(episodes)].tolist(), flat

    def _redraw(self, episodes: list, mine: list[float], flat: torch.Tensor) -> tuple[list, list[float]]:
        """Dynamic sampling (`vlrl.training.dynamic_sampling.redraw_groups`, the loop single-turn runs use): each flat
        group of this process's episodes replaced by a group of fresh training seeds whose returns differ, up to
        `dynamic_sampling` more draws."""
        group, rank = self.num_generations, self.accelerator.process_index
        groups = len(episodes) // group
        local_flat = flat[rank * groups:(rank + 1) * groups].tolist()
        pool = self.train_dataset["seed"]

        def draw_groups(attempt: int, count: int) -> tuple[tuple[list, list[float]], list[bool]]:
            chosen = [pool[i] for i in redraw.draw(count, len(pool), self.args.seed, self.state.global_step, attempt,
                                                   rank)]
            fresh = self._play([seed for seed in chosen for _ in range(group)])
            _, fresh_mine, fresh_flat = self._advantages(fresh)
            return (fresh, fresh_mine), fresh_flat[rank * count:(rank + 1) * count].tolist()

        def take(old: int, fresh: tuple[list, list[float]], new: int) -> None:
            episodes[old * group:(old + 1) * group] = fresh[0][new * group:(new + 1) * group]
            mine[old * group:(old + 1) * group] = fresh[1][new * group:(new + 1) * group]

        extra = redraw.redraw_groups(self.accelerator, local_flat, self.dynamic_sampling, draw_groups, take)
        for key, value in redraw.outcome(self.accelerator, extra, local_flat).items():
            self.log_metric(key, value)
        return episodes, mine

    def _log_rollout(self, episodes, returns: torch.Tensor, flat: torch.Tensor) -> None:
        s = summary(episodes)
        counts = torch.tensor([s["episodes"], s["success_rate"] * s["episodes"], s["length_mean"] * s["episodes"],
                               s["invalid_actions"], s["truncated"], s["failed"], s["dropped_images"],
                               sum(len(ids) for e in episodes for ids in e.reply_ids),
                               sum(len(e.reply_ids) for e in episodes),
                               sum(len(ids) >= self.play_settings.max_new_tokens for e in episodes
                                   for ids in e.reply_ids)],
                              dtype=torch.float64, device=self.accelerator.device)
        n, success, turns, invalid, truncated, failed, dropped, tokens, replies, clipped = \
            self.accelerator.reduce(counts, reduction="sum").tolist()
        metrics = self.train_metrics
        kept = returns[~torch.isnan(returns)]
        metrics["reward"].append(kept.mean().item() if kept.numel() else 0.0)
        metrics["reward_std"].append(kept.std().item() if kept.numel() > 1 else 0.0)
        metrics["rewards/episode_return/mean"].append(kept.mean().item() if kept.numel() else 0.0)
        metrics["frac_reward_zero_std"].append(flat.float().mean().item())
        metrics["rewards/success/mean"].append(success / max(1, n))
        metrics["completions/turns_mean"].append(turns / max(1, n))
        metrics["completions/invalid_actions"].append(invalid)
        metrics["episodes/truncated"].append(truncated)
        metrics["episodes/failed"].append(failed)
        metrics["episodes/dropped_images"].append(dropped)
        metrics["completions/mean_length"].append(tokens / max(1, replies))
        metrics["completions/clipped_ratio"].append(clipped / max(1, replies))
        if failed == n:
            reasons = "; ".join(s["failures"]) or "no reason given"
            raise EnvError(f"every episode of this step failed ({int(n)} of {int(n)}), so there is nothing to train "
                           f"on: {reasons}. Check the environment and its [env] options with `vlrl env play`.")
        if failed and self.episode_log is not None:
            self.episode_log(f"{int(failed)} of {int(n)} episodes failed (trained on none of their turns): "
                             + "; ".join(s["failures"]))

    def _micro_batches(self, rows: list[dict]) -> list[dict]:
        """The process's rows as `steps_per_generation` micro-batches of passes, each pass in TRL's batch form with its
        weight; every process ends with the same number of passes in each micro-batch."""
        segments = scoring.segments(rows)
        chunks = [passes(chunk, self.pass_tokens) for chunk in split_turns(segments, self.args.steps_per_generation)]
        counts = torch.tensor([len(c) for c in chunks], device=self.accelerator.device)
        most = self.accelerator.gather(counts[None]).view(-1, len(chunks)).amax(dim=0).clamp(min=1).tolist()
        tokens = self.accelerator.gather(torch.tensor(sum(len(r["reply_ids"]) for r in rows),
                                                      device=self.accelerator.device)).sum()
        filler = segments[:1]
        batches = []
        for chunk, n in zip(chunks, most):
            turns = [[r for segment in p for r in segment] for p in chunk]
            micro_rows, micro_tokens = sum(map(len, turns)), sum(len(r["reply_ids"]) for t in turns for r in t)
            weighted = [(self._pass_inputs(p, tokens),
                         pass_weight(self.loss_type, len(t), sum(len(r["reply_ids"]) for r in t), micro_rows,
                                     micro_tokens)) for p, t in zip(chunk, turns)]
            if n > len(chunk):  # another process has more passes here: zero-weight ones keep the calls in step
                weighted += [(self._pass_inputs(filler, tokens), 0.0)] * (n - len(chunk))
            batches.append({"passes": weighted})
        return batches

    def _pass_inputs(self, chosen: list[list[dict]], num_items) -> dict:
        """One pass's turns in the form TRL's loss reads (`generate_and_score`'s output):
        replies right-padded, advantages, sampled log-probs, one placeholder token as each row's prompt, and under
        "merged" the forward of its segments that scores them (`vlrl.episodes.scoring`). No segments (every episode
        of this process failed): one masked row of a single pad token, scored by TRL's own forward, which trains
        nothing."""
        from trl.trainer.utils import pad

        device = self.accelerator.device
        pad_id = self.processing_class.tokenizer.pad_token_id
        rows = [r for segment in chosen for r in segment]
        if not rows:
            one = torch.tensor([[pad_id]], device=device)
            return {"prompt_ids": one, "prompt_mask": torch.ones_like(one), "completion_ids": one,
                    "completion_mask": torch.zeros_like(one), "advantages": torch.zeros(1, device=device),
                    "num_items_in_batch": num_items}
        replies = [torch.tensor(r["reply_ids"]) for r in rows]
        completion_ids = pad(replies, padding_value=pad_id, padding_side="right")
        reply_mask = pad([torch.ones_like(x) for x in replies], padding_value=0, padding_side="right")
        completion_mask = reply_mask
        if self.mask_truncated_completions:  # as TRL: a reply cut at the budget (no stop token) trains nothing
            ends = {*self.eos_token_ids, pad_id}
            completion_mask = reply_mask * torch.tensor([[int(r["reply_ids"][-1] in ends)] for r in rows])
        placeholder = torch.full((len(rows), 1), pad_id)
        merged = scoring.merged_inputs(self.processing_class, chosen)
        merged["reply_mask"] = reply_mask
        out = {"prompt_ids": placeholder, "prompt_mask": torch.ones_like(placeholder),
               "completion_ids": completion_ids, "completion_mask": completion_mask,
               "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
               "num_items_in_batch": num_items, "merged": merged}
        if all(r["logps"] is not None for r in rows):
            out["sampling_per_token_logps"] = pad([torch.tensor(r["logps"], dtype=torch.float32) for r in rows],
                                                  padding_value=0.0, padding_side="right")
        out = send_to_device(out, device)
        if self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations):
            out["old_per_token_logps"] = self._old_logps(out)  # the rollout policy's, fixed across its updates
        return out

    def _old_logps(self, inputs: dict) -> torch.Tensor:
        from trl.models.utils import disable_gradient_checkpointing  # (trl.trainer.utils never had it)

        self._merged = inputs["merged"]
        try:
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                return self._merged_logps(self.model, False)[0]
        finally:
            self._merged = None


def checkpoint_activations(policy) -> None:
    """On a CUDA GPU, the decoder layers recompute their activations in the backward pass (gradient checkpointing,
    as TRL's GSPO there); on the CPU it would only cost time. `vlrl.run_episodes` calls it at load, before any
    decoding: compiled decoding graphs guard on the flag, so turning it on between the baseline episodes and training
    would compile every cache length's graph again (at the 2B shape on an H200, the first step's 8 sampled episodes
    took 215 s and the 8 eval episodes after it 96 s; how much of that was compiling was not measured apart)."""
    if next(policy.parameters()).is_cuda:
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
