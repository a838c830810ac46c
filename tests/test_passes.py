"""`[training] pass_tokens` (`vlrl.training.passes`): which micro-steps train which micro-batches, rows joined as TRL's
batch form joins them, the settings refused where they cannot hold; then on the tiny model (slow) one optimizer step in
one merged pass moves the LoRA weights exactly as TRL's micro-batches one by one do."""

import zlib

import pytest
import torch

from vlrl.base.errors import ConfigError
from vlrl.config import runfile as cfg
from vlrl.training import dynamic_sampling, passes


@pytest.mark.parametrize(("count", "rows", "width", "budget", "plan"), [
    (4, 4, 700, 6000, [0, 0, 2, 2]),
    (4, 4, 700, 9000, [0, 0, 1, 3]),     # 3 fit: a partial pass first, the full one last
    (4, 4, 1500, 6000, [1, 1, 1, 1]),    # one fits: nothing merges
    (4, 4, 1500, 100, [1, 1, 1, 1]),     # not even one fits: each still trains, alone
    (8, 2, 50, 10**6, [0] * 7 + [8]),
])
def test_the_plan_trains_every_micro_batch_once_and_ends_on_a_real_pass(count, rows, width, budget, plan):
    got = passes.merge_plan(count, rows=rows, width=width, budget=budget)
    assert got == plan and sum(got) == count and got[-1] > 0


def test_a_pass_drops_the_completion_columns_every_row_pads():
    """Rows ending after 3 and 5 of 8 completion columns: 5 kept, in every per-token field (the token types over prompt
    and completion too); the pictures, advantages and a (B, 1) field as they were. A per-token field it does not know
    keeps the batch whole; a batch whose completions are all masked keeps one column."""
    batch = _micro_batch(2, [1, 1], 0)
    batch["completion_ids"] = torch.arange(16).view(2, 8)
    batch["completion_mask"] = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
    batch["old_per_token_logps"] = torch.randn(2, 8)
    batch["importance_sampling_ratio"] = torch.ones(2, 1)
    batch["mm_token_type_ids"] = torch.arange(26).view(2, 13)  # 5 prompt columns + 8
    out = passes.trimmed(batch)
    assert out["completion_ids"].tolist() == [[0, 1, 2, 3, 4], [8, 9, 10, 11, 12]]
    assert out["old_per_token_logps"].shape == (2, 5) and out["mm_token_type_ids"].tolist() == [
        list(range(10)), list(range(13, 23))]
    for key in ("prompt_ids", "pixel_values", "advantages", "image_grid_thw", "importance_sampling_ratio"):
        assert out[key] is batch[key], key
    assert passes.trimmed({**batch, "per_token_thing": torch.zeros(2, 8)})["completion_ids"].size(1) == 8
    silent = passes.trimmed({**batch, "completion_mask": torch.zeros(2, 8)})
    assert silent["completion_ids"].size(1) == 1


def _micro_batch(rows: int, images: list[int], seed: int) -> dict:
    """A micro-batch in TRL's form: prompt and completion fields, one flat pixel tensor over each row's pictures."""
    g = torch.Generator().manual_seed(seed)
    grids = torch.tensor([[1, 2, 2]] * sum(images))
    return {"prompt_ids": torch.randint(0, 99, (rows, 5), generator=g), "prompt_mask": torch.ones(rows, 5),
            "completion_ids": torch.randint(0, 99, (rows, 3), generator=g), "completion_mask": torch.ones(rows, 3),
            "advantages": torch.randn(rows, generator=g), "pixel_values": torch.randn(4 * sum(images), 6, generator=g),
            "image_grid_thw": grids, "num_images": images, "num_items_in_batch": torch.tensor(12.0)}


def test_joined_rows_are_what_dynamic_samplings_row_merge_makes():
    """Two micro-batches (the second's rows with 2 pictures and 1) joined keep each row's tokens and its own pictures:
    the same batch `merge_rows` builds row by row."""
    first, second = _micro_batch(2, [1, 1], 0), _micro_batch(2, [2, 1], 1)
    joined = passes.concatenated([first, second])
    reference = dynamic_sampling.merge_rows([first, second], [(0, 0), (0, 1), (1, 0), (1, 1)], pad_id=0)
    assert joined["num_images"] == [1, 1, 2, 1] and joined["num_items_in_batch"] == 12.0
    for key, value in reference.items():
        assert (torch.equal(joined[key], value) if isinstance(value, torch.Tensor) else joined[key] == value), key


def test_the_loss_types_validation_lets_merge_are_the_losss_own_non_token_reductions():
    from vlrl.config.sections import PASS_LOSS_TYPES
    from vlrl.training.loss import REDUCTIONS

    assert set(PASS_LOSS_TYPES) == {kind for kind, reduction in REDUCTIONS.items() if reduction != "tokens"}


def test_the_settings_it_cannot_honour_are_refused():
    with pytest.raises(ConfigError, match="pass_tokens = -1 must be 0"):
        cfg.preset("tiny", overrides=["training.pass_tokens=-1"])
    with pytest.raises(ConfigError, match="pass_tokens needs the transformers backend"):
        cfg.preset("tiny", overrides=["training.pass_tokens=4096", "model.backend=unsloth"])
    assert cfg.preset("tiny", overrides=["training.pass_tokens=4096"]).training.pass_tokens == 4096


def _trained_delta(tmp_path, recipe: str, pass_tokens: int, overrides: tuple = ()):
    """The tiny preset's LoRA weights' change over one optimizer step of 8 canned completions (2 prompts x 4, two
    rows a micro-batch, plain SGD), and how many scoring forwards the step ran."""
    from vlrl import run
    from vlrl.training import train

    config = cfg.preset("tiny", overrides=[
        f"training.recipe={recipe}", "training.max_steps=1", "training.per_device_train_batch_size=2",
        "training.gradient_accumulation_steps=4", "training.num_generations=4", "training.optim=sgd",
        "training.learning_rate=1.0", "training.weight_decay=0", "training.warmup_steps=0",
        "training.save_steps=100", f"training.pass_tokens={pass_tokens}", *overrides])
    policy, processor = run.load_policy(config, log=lambda *_: None)
    train_ds, _ = run.prepare(config, processor, log=lambda *_: None)
    trainer = train.build_trainer(config, policy, processor, train_ds, tmp_path / str(pass_tokens),
                                  log=lambda *_: None)
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    answers = [processor.tokenizer.encode(text, add_special_tokens=False) + [end] for text in (
        "<REASONING>a</REASONING><SOLUTION>3</SOLUTION>", "<SOLUTION>5</SOLUTION>", "it is 2", "<REASONING>b")]

    def generate(prompt_ids, *args, **kwargs):  # each prompt's 4 rollouts: the 4 answers, whatever the model
        counts, out = {}, []
        for ids in prompt_ids:
            key = zlib.crc32(str(tuple(ids)).encode())
            counts[key] = counts.get(key, -1) + 1
            out.append(list(answers[counts[key] % 4]))
        return out, None

    trainer.generate_rollouts = generate
    forwards = []  # each scoring forward's width (prompt + completion columns)
    score = trainer.token_logps
    trainer.token_logps = lambda model, ids, *args, **kwargs: forwards.append(ids.size(1)) or score(model, ids, *args,
                                                                                                     **kwargs)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer.train()
    return {n: p.detach() - before[n] for n, p in policy.named_parameters() if p.requires_grad}, forwards


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "overrides", "forwards"), [
    ("gspo", (), (4, 1)),        # dr_grpo over rows: the 4 micro-batches of one optimizer step in one pass
    ("gspo-paper", (), (2, 2)),  # grpo, an optimizer step per micro-batch: nothing merges across steps (the old
                                 # log-probs' forward, then the step's one micro-batch)
    ("gspo", ("training.gradient_accumulation_steps=2", "training.generation_batch_size=8", "training.max_steps=2"),
     (5, 3)),                    # one generation of 8 for two optimizer steps of 4 (and its old log-probs'
                                 # forward): a pass each step, not one for both
])
def test_merged_passes_move_the_weights_as_the_micro_batches_do(tiny_dir, tmp_path, recipe, overrides, forwards):
    apart, forwards_apart = _trained_delta(tmp_path, recipe, 0, overrides)
    merged, forwards_merged = _trained_delta(tmp_path, recipe, 10**6, overrides)
    assert (len(forwards_apart), len(forwards_merged)) == forwards
    assert sum(d.abs().sum() for d in apart.values()) > 0  # the step moved the weights
    for name, delta in apart.items():
        torch.testing.assert_close(merged[name], delta, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.slow
def test_passes_without_trailing_padding_move_the_weights_as_whole_ones(tiny_dir, tmp_path, monkeypatch):
    """The canned answers differ in length, so passes of two rows are narrower than the generation batch's padding:
    the same weights after a step as with every pass at the whole width."""
    trimmed, trimmed_widths = _trained_delta(tmp_path / "trimmed", "gspo", 0)
    monkeypatch.setattr(passes, "trimmed", lambda batch: batch)
    whole, whole_widths = _trained_delta(tmp_path / "whole", "gspo", 0)
    assert len(set(whole_widths)) == 1 and min(trimmed_widths) < whole_widths[0]  # some pass was narrower
    for name, delta in whole.items():
        torch.testing.assert_close(trimmed[name], delta, rtol=1e-4, atol=1e-7, msg=name)
