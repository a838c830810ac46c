"""Dynamic sampling (DAPO's rule): a group whose rewards are all equal has advantage 0 and teaches GSPO nothing, so
with `[training] dynamic_sampling = N` the trainer draws new groups for such groups, up to N more draws per step,
and trains on groups that differ. TRL 1.14.2 has no such option; six of the eight peers surveyed do.

    >>> flat_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2).tolist()
    [True, False]

Each draw takes fresh prompts (single-turn rows, or an episode run's training seeds) with a generator seeded by the
run's seed, the step and the draw, so a resumed run draws the same ones; each process replaces its own flat groups
(a process's share of a step holds whole groups: `vlrl validate` says so), every process drawing as many groups as
the one that needs most, since generation and scoring gather across processes. A group still flat after the last
draw is trained as it is (its advantage is 0). Every step logs, on or off:

- `frac_reward_zero_std`: the share of the step's first-drawn groups whose rewards were all equal (TRL's name);
- `dynamic_sampling/extra_groups`: groups drawn again (on), those that came back flat too included: the redraws' cost;
- `dynamic_sampling/frac_zero_std_after`: the share still flat in what trains (on).

`Redraws` is mixed into vlrl's single-turn GRPOTrainer; `vlrl.episodes.trainer` applies the same rule to episodes.
"""

from __future__ import annotations

import torch

# the batch's per-row fields by how TRL pads them: prompts on the left, completions on the right
LEFT = ("prompt_ids", "prompt_mask")
RIGHT = ("completion_ids", "completion_mask", "old_per_token_logps", "sampling_per_token_logps",
         "ref_per_token_logps", "tool_mask", "importance_sampling_ratio")
SPANNING = ("mm_token_type_ids", "token_type_ids")  # prompt + completion
ROWS = ("advantages", "pixel_values", "image_grid_thw", "num_images")


def flat_groups(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """Which groups (consecutive `group` rows) have rewards all equal, NaNs (failed or unscored) left out."""
    grouped = rewards.view(-1, group)
    low = torch.where(torch.isnan(grouped), torch.inf, grouped).amin(dim=1)
    high = torch.where(torch.isnan(grouped), -torch.inf, grouped).amax(dim=1)
    return ~(high - low > 1e-9)


def draw(count: int, pool: int, seed: int, step: int, attempt: int, rank: int) -> list[int]:
    """`count` indices into a pool of `pool` items, the same for the same run seed, step, draw and process.

    >>> draw(3, 10, 0, 1, 1, 0) == draw(3, 10, 0, 1, 1, 0), len(draw(3, 10, 0, 1, 1, 0))
    (True, 3)
    """
    generator = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 101 + attempt) * 1009 + rank)
    return torch.randint(pool, (count,), generator=generator).tolist()


def replacements(flat: list[bool], fresh_flat: list[bool]) -> dict[int, int]:
    """Which fresh group replaces which flat one: the flat groups in order, each by the next fresh group that is not
    flat.

    >>> replacements([True, False, True], [True, False, False])
    {0: 1, 2: 2}
    """
    good = [j for j, f in enumerate(fresh_flat) if not f]
    return dict(zip([i for i, f in enumerate(flat) if f], good))


def most_flat(accelerator, flat: list[bool]) -> int:
    """How many groups every process draws this round: the most flat groups any process still has (drawing and
    scoring gather across processes, so all draw alike)."""
    need = torch.tensor([sum(flat)], device=accelerator.device)
    return int(accelerator.gather(need).max())


def outcome(accelerator, extra: int, flat: list[bool]) -> dict[str, float]:
    """The step's logged numbers over every process: groups drawn again, and the share still flat in what trains."""
    totals = accelerator.reduce(torch.tensor([extra, sum(flat), len(flat)], dtype=torch.float64,
                                             device=accelerator.device), reduction="sum").tolist()
    return {"dynamic_sampling/extra_groups": totals[0],
            "dynamic_sampling/frac_zero_std_after": totals[1] / max(1, totals[2])}


def merge_rows(batches: list[dict], picks: list[tuple[int, int]], pad_id: int) -> dict:
    """One batch in TRL's form (`GRPOTrainer._generate_and_score_completions`' output) of the rows `picks` ((batch,
    row) pairs) of `batches`, each field padded as TRL pads it. A field vlrl does not know is refused, never dropped."""
    from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

    batches = [split_pixel_values_by_grid(b) for b in batches]
    known = {*LEFT, *RIGHT, *SPANNING, *ROWS, "num_items_in_batch"}
    unknown = {k for b in batches for k in b} - known
    if unknown:
        raise ValueError(f"dynamic sampling cannot merge the batch fields {sorted(unknown)}; turn it off for this run.")
    prompt_width = max(b["prompt_ids"].size(1) for b in batches)
    completion_width = max(b["completion_ids"].size(1) for b in batches)
    out = {}
    for key in batches[0]:
        if key == "num_items_in_batch":
            continue
        values = [b[key] for b in batches]
        if key in LEFT or key in RIGHT or key in SPANNING:
            values = [_pad(b, key, v, prompt_width, completion_width, pad_id) for b, v in zip(batches, values)]
            out[key] = torch.stack([values[i][r] for i, r in picks])
        elif isinstance(values[0], torch.Tensor):
            out[key] = torch.stack([values[i][r] for i, r in picks])
        else:
            out[key] = [values[i][r] for i, r in picks]
    if "pixel_values" in out:
        out = unsplit_pixel_values_by_grid(out)
    return out


def _pad(batch: dict, key: str, value: torch.Tensor, prompt_width: int, completion_width: int, pad_id: int):
    fill = pad_id if key in ("prompt_ids", "completion_ids") else (1 if key == "tool_mask" else 0)
    if key in LEFT:
        return torch.nn.functional.pad(value, (prompt_width - value.size(1), 0), value=fill)
    if key in RIGHT:
        return value if value.size(1) == 1 else torch.nn.functional.pad(value, (0, completion_width - value.size(1)),
                                                                         value=fill)
    split = batch["prompt_ids"].size(1)  # a field over prompt and completion: each part padded its own way
    left = torch.nn.functional.pad(value[:, :split], (prompt_width - split, 0), value=fill)
    right = torch.nn.functional.pad(value[:, split:], (0, completion_width - (value.size(1) - split)), value=fill)
    return torch.cat([left, right], dim=1)


class Redraws:
    """Mixed into vlrl's single-turn GRPOTrainer: `_generate_and_score_completions` draws new groups for the flat
    ones, up to `dynamic_sampling` more draws a step (0: off, but the share of flat groups is still logged)."""

    dynamic_sampling = 0
    _rewards = None  # the last scoring's rewards (every process's), weighted and summed

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        self._rewards = rewards
        return per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training or not self.dynamic_sampling:
            return out
        metrics = {k: len(v) for k, v in self._metrics["train"].items()}  # what the step's first draw logged
        out, stats = self._redraw(out, len(inputs))
        for key, values in self._metrics["train"].items():  # the logged rewards stay the first draw's
            del values[metrics.get(key, 0):]
        for key, value in stats.items():
            self._metrics["train"][key].append(value)
        return out

    def _redraw(self, out: dict, rows: int) -> tuple[dict, dict]:
        group, rank = self.num_generations, self.accelerator.process_index
        flat = flat_groups(self._rewards, group)[rank * rows // group:(rank + 1) * rows // group].tolist()
        batches, picks = [out], [(0, r) for r in range(rows)]
        extra = 0
        for attempt in range(1, self.dynamic_sampling + 1):
            most = most_flat(self.accelerator, flat)
            if not most:
                break
            chosen = draw(most, len(self.train_dataset), self.args.seed, self.state.global_step, attempt, rank)
            fresh_rows = [self.train_dataset[i] for i in chosen for _ in range(group)]
            fresh = super()._generate_and_score_completions(fresh_rows)
            extra += most  # every group drawn costs its rollout, whether or not it replaces a flat one
            fresh_flat = flat_groups(self._rewards, group)[rank * most:(rank + 1) * most].tolist()
            for old, new in replacements(flat, fresh_flat).items():
                picks[old * group:(old + 1) * group] = [(len(batches), new * group + j) for j in range(group)]
                flat[old] = False
            batches.append(fresh)
        merged = merge_rows(batches, picks, self.processing_class.tokenizer.pad_token_id) if len(batches) > 1 else out
        mask = merged["completion_mask"] * merged.get("tool_mask", 1)
        merged["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return merged, outcome(self.accelerator, extra, flat)


def trainer_class(base: type) -> type:
    """`base` (vlrl's single-turn GRPOTrainer class, `vlrl.mismatch.trainer_class`) with dynamic sampling."""
    return type(f"Redrawing{base.__name__}", (Redraws, base), {"__module__": __name__})
