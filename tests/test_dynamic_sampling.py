"""Dynamic sampling (`vlrl.training.dynamic_sampling`): which groups are flat, the seeded draws, which fresh group replaces
which, rows merged in TRL's batch form; then on the tiny model (slow) a single-turn step whose flat groups are drawn
again, and an episode step's."""

import json
import zlib

import pytest
import torch

from vlrl.base.errors import ConfigError
from vlrl.config import runfile as cfg
from vlrl.training import dynamic_sampling as ds


def test_flat_groups_leave_unscored_rows_out():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan")])
    assert ds.flat_groups(rewards, 2).tolist() == [True, False, True, True]


def test_draws_repeat_for_the_same_step_and_differ_between_draws():
    assert ds.draw(4, 100, 0, 3, 1, 0) == ds.draw(4, 100, 0, 3, 1, 0)
    assert ds.draw(4, 100, 0, 3, 1, 0) != ds.draw(4, 100, 0, 3, 2, 0) != ds.draw(4, 100, 0, 3, 1, 1)
    assert all(0 <= i < 5 for i in ds.draw(50, 5, 1, 1, 1, 0))


def test_a_flat_group_is_replaced_only_by_a_group_that_differs():
    assert ds.replacements([True, True, False], [True, False]) == {0: 1}
    assert ds.replacements([False], [False]) == {}


def _batch(prompts, completions, images):
    """A TRL batch: prompts left-padded, completions right-padded, one picture (grid 1x2x2 = 4 pixel rows) per image."""
    from trl.trainer.utils import pad

    p = [torch.tensor(x) for x in prompts]
    c = [torch.tensor(x) for x in completions]
    out = {"prompt_ids": pad(p, padding_value=9, padding_side="left"),
           "prompt_mask": pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left"),
           "completion_ids": pad(c, padding_value=9, padding_side="right"),
           "completion_mask": pad([torch.ones_like(x) for x in c], padding_value=0, padding_side="right"),
           "advantages": torch.arange(len(p), dtype=torch.float32), "num_items_in_batch": torch.tensor(0),
           "num_images": images, "image_grid_thw": torch.tensor([[1, 2, 2]] * sum(images))}
    out["pixel_values"] = torch.arange(4 * sum(images) * 3, dtype=torch.float32).view(-1, 3) + 100 * len(p)
    out["mm_token_type_ids"] = torch.cat([(out["prompt_ids"] == 5).long(), torch.zeros_like(out["completion_ids"])], 1)
    return out


def test_merged_rows_keep_each_rows_tokens_pictures_and_padding():
    a = _batch([[1, 5], [1, 2, 5]], [[7], [7, 7]], [1, 1])
    b = _batch([[3, 3, 3, 5]], [[8, 8, 8]], [2])
    merged = ds.merge_rows([a, b], [(0, 0), (1, 0), (0, 1)], pad_id=9)
    assert merged["prompt_ids"].tolist() == [[9, 9, 1, 5], [3, 3, 3, 5], [9, 1, 2, 5]]
    assert merged["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]
    assert merged["completion_ids"].tolist() == [[7, 9, 9], [8, 8, 8], [7, 7, 9]]
    assert merged["mm_token_type_ids"].tolist() == [[0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0]]
    assert merged["advantages"].tolist() == [0.0, 0.0, 1.0] and merged["num_images"] == [1, 2, 1]
    assert torch.equal(merged["pixel_values"], torch.cat([a["pixel_values"][:4], b["pixel_values"],
                                                          a["pixel_values"][4:]]))
    with pytest.raises(ValueError, match="cannot merge the batch fields"):
        ds.merge_rows([{**a, "made_up": torch.zeros(2)}], [(0, 0)], pad_id=9)


def test_validation_refuses_groups_split_across_micro_batches_of_a_process():
    cfg.preset("tiny", overrides=["training.dynamic_sampling=2"])
    with pytest.raises(ConfigError, match="dynamic_sampling replaces whole groups"):
        cfg.preset("tiny", overrides=["training.dynamic_sampling=2", "training.per_device_train_batch_size=2",
                                      "training.gradient_accumulation_steps=1"], num_processes=2)
    with pytest.raises(ConfigError, match="must be 0 \\(off\\)"):
        cfg.preset("tiny", overrides=["training.dynamic_sampling=-1"])


def _one_step_trainer(tmp_path, override: str):
    """The tiny preset's single-turn trainer, one step of 8 rows, with `override`; and `encode`: a text as a
    completion's token ids, its <|im_end|> included."""
    from vlrl import run
    from vlrl.training import train

    config = cfg.preset("tiny", overrides=["training.max_steps=1", "training.per_device_train_batch_size=8",
                                           "training.gradient_accumulation_steps=1", override])
    policy, processor = run.load_policy(config, log=lambda *_: None)
    train_ds, _ = run.prepare(config, processor, log=lambda *_: None)
    trainer = train.build_trainer(config, policy, processor, train_ds, tmp_path, log=lambda *_: None)
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return trainer, train_ds, lambda text: processor.tokenizer.encode(text, add_special_tokens=False) + [end]


@pytest.mark.slow
def test_a_single_turn_step_draws_new_groups_for_flat_ones(tiny_dir, tmp_path):
    """Rollouts fixed per prompt (as tests/two_process_worker.py's canned answers): the step's first prompt gets one
    answer four times (a flat group), every other prompt four different answers. With dynamic sampling the flat group
    is replaced by a fresh one that differs; the logged rewards stay the first draw's."""
    trainer, train_ds, encode = _one_step_trainer(tmp_path, "training.dynamic_sampling=4")
    answers = [encode(t) for t in
               ("<REASONING>a</REASONING><SOLUTION>3</SOLUTION>", "<SOLUTION>5</SOLUTION>", "it is 2", "<REASONING>")]
    flat = []  # the prompt that always gets the same answer

    def generate(prompt_ids, *args, **kwargs):
        copies, out = {}, []
        for ids in prompt_ids:
            key = zlib.crc32(str(tuple(ids)).encode())
            flat[:] = flat or [key]
            j = copies[key] = copies.get(key, -1) + 1
            out.append(list(answers[0 if key == flat[0] else j % 4]))
        return out, None

    trainer.generate_rollouts = generate
    batch = trainer.generate_and_score([train_ds[i] for i in (0, 0, 0, 0, 1, 1, 1, 1)])
    completions = batch["completion_ids"].view(2, 4, -1)
    assert all(len({tuple(row.tolist()) for row in group}) == 4 for group in completions)  # no flat group left
    metrics = trainer.train_metrics
    assert metrics["frac_reward_zero_std"] == [0.5] and metrics["dynamic_sampling/extra_groups"] == [1.0]
    assert metrics["dynamic_sampling/frac_zero_std_after"] == [0.0]
    lengths = [len(a) for a in answers]  # first draw: the flat group 4 x answer 0, the other each answer; then 1 group
    assert metrics["dynamic_sampling/generated_tokens"] == [4 * lengths[0] + 2 * sum(lengths)]
    assert len(metrics["reward"]) == 1  # the first draw's, not the redraws'
    monitor, collapse, step_line = trainer.watchers  # accuracy, degeneration/* and collapse/* count the first 8 too
    assert (monitor.seen, step_line.scored, len(collapse.samples)) == (8, 8, 8)
    assert batch["advantages"].view(2, 4).abs().sum(dim=1).gt(0).all()
    assert batch["num_items_in_batch"] == batch["completion_mask"].sum()


@pytest.mark.slow
def test_a_group_of_eight_equal_rewards_is_logged_flat(tiny_dir, tmp_path):
    """Eight copies of one answer: their weighted rewards (0.3 x format + correctness, float32) are equal, but TRL's
    own frac_reward_zero_std reads their std (~6e-8, not 0) as spread. The step logs the group flat, and so does the
    collapse monitor that reads it."""
    trainer, train_ds, encode = _one_step_trainer(tmp_path, "training.num_generations=8")
    answer = encode("<REASONING>a</REASONING><SOLUTION>3</SOLUTION>")
    trainer.generate_rollouts = lambda prompt_ids, *args, **kwargs: ([list(answer) for _ in prompt_ids], None)
    trainer.generate_and_score([train_ds[0]] * 8)
    rewards = trainer._rewards
    assert torch.equal(rewards, rewards[:1].expand_as(rewards)) and rewards.std().item() > 1e-8  # what TRL misread
    assert trainer.train_metrics["frac_reward_zero_std"] == [1.0]


@pytest.mark.slow
@pytest.mark.head_lora  # grid-tiny's LoRA on the output layer
def test_an_episode_step_draws_new_groups_for_flat_ones(tiny_dir, tmp_path):
    """Grid episodes without shaping on a 3x3 grid in 2 turns: the goal is 4 moves away, so every episode fails and
    every group, drawn first or again, is flat. All 3 draws are made and counted (their cost), none replaces a group,
    and the step logs what stayed flat."""
    from vlrl import run
    from vlrl.training import episode_trainer, train

    config = cfg.preset("grid-tiny", overrides=[
        "training.per_device_train_batch_size=8", "training.num_generations=4", "training.dynamic_sampling=3",
        "env.max_turns=2", "env.options={size=3, difficulty=1, max_turns=2, shaping=false}"])
    policy, processor = run.load_policy(config, log=lambda *_: None)
    built = train.build_trainer(config, policy, processor, episode_trainer.seed_dataset(range(1_000_000, 1_000_008)),
                                tmp_path, log=lambda *_: None)
    torch.manual_seed(0)
    batches = built._play_and_batch([{"seed": s} for s in (1_000_000,) * 4 + (1_000_001,) * 4])
    metrics = built.train_metrics
    assert metrics["frac_reward_zero_std"] == [1.0] and metrics["dynamic_sampling/frac_zero_std_after"] == [1.0]
    assert metrics["dynamic_sampling/extra_groups"] == [6.0]  # 3 draws of the 2 flat groups, all flat again
    turns = metrics["completions/turns_mean"][0] * 8  # what the step trains on: every turn of the 8 episodes
    assert metrics["episodes/turns_trained"][0] + metrics["episodes/turns_dropped/empty_reply"][0] == turns
    assert metrics["episodes/turns_dropped/failed_episode"] == [0.0]
    assert built.degeneration_monitor.seen == turns  # the first draw's replies, not the redraws'
    advantages = torch.cat([p["advantages"] for b in batches for p, _ in b["passes"]])
    assert (advantages == 0).all()
    json.dumps({k: v for k, v in metrics.items()})  # what train_log.jsonl gets is plain numbers
