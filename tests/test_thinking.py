"""Thinking models and `thinking_budget`: the budget processor on handcrafted ids, then real generation on the tiny
Qwen3-VL with a Qwen3-VL-Thinking-style chat template (the prompt opens `<think>`), in eval and in GSPO rollouts; and
how the rewards and the eval records read a completion that thinks."""

import json

import pytest
import torch

from vlrl import engine
from vlrl.base import synthetic
from vlrl.config import runfile as cfg
from vlrl.config.validation import problems_of
from vlrl.engine.sampling import Budget
from vlrl.evaluation import evaluate
from vlrl.grammar import rewards, thinking
from vlrl.model import loading as model
from vlrl.model import prompts, tiny
from vlrl.training import train

OPEN, CLOSE, NL2 = 151667, 151668, 271  # <think>, </think>, "\n\n" in Qwen3's vocabulary
VOCAB = 151936


def forced(setup: tuple, rows) -> list:
    """The token the engine forces on each row after its generated ids, or None where the choice is left to the
    logits. `setup` is (the Budget, the prompt's length): the ids past the prompt are fed one step at a time."""
    from vlrl.engine.sampling import TokenChooser

    budget, prompt_length = setup
    result = []
    for row in rows:
        chooser = TokenChooser(torch.tensor([row[:prompt_length]]), stop_ids=[151645], budget=budget)
        for token in row[prompt_length:]:
            peaked = torch.full((1, VOCAB), -1e9)
            peaked[0, token] = 0.0
            assert chooser(peaked).item() == token  # the row is one the budget allows
        scores = torch.randn(1, VOCAB)
        chosen = chooser(scores).item()
        result.append(None if chosen == scores.argmax().item() else chosen)
    return result


@pytest.fixture(scope="module")
def thinking_processor():
    """The tiny processor with a thinking chat template, built fresh (Qwen3's flags: `<think>` is not special)."""
    return tiny.build_processor(chat_template=prompts.THINKING_CHAT_TEMPLATE)


def test_the_tiny_tokenizer_has_qwen3s_thinking_ids_and_keeps_them_in_decoded_text(thinking_processor, tiny_processor):
    tokenizer = thinking_processor.tokenizer
    assert thinking.think_ids(tokenizer) == (OPEN, CLOSE)
    assert tokenizer.encode(thinking.AFTER_CLOSE, add_special_tokens=False) == [NL2]
    # TRL decodes completions with skip_special_tokens, as Qwen3's tokenizer keeps <think> and </think> through that
    assert tokenizer.decode([OPEN, 18, CLOSE, NL2, 151645], skip_special_tokens=True) == "<think>3</think>\n\n"
    assert thinking.template_opening(thinking_processor) == "<think>\n"
    assert thinking.template_opening(tiny_processor) == ""


# --- the engine's budget on handcrafted ids: P = pad, a prompt, then generated ones ---------------------------------
P, Q = 151643, 100  # pad, any prompt/thinking token


def test_a_block_opened_in_the_prompt_is_closed_after_budget_generated_tokens():
    budget = (Budget(3, OPEN, CLOSE, NL2), 4)
    assert forced(budget, [[Q, Q, OPEN, Q]]) == [None]  # the prompt's "\n" after <think> is not a thinking token
    assert forced(budget, [[Q, Q, OPEN, Q, 5, 6]]) == [None]
    assert forced(budget, [[Q, Q, OPEN, Q, 5, 6, 7]]) == [CLOSE]  # 3 generated: the budget closes the block
    assert forced(budget, [[Q, Q, OPEN, Q, 5, 6, 7, CLOSE]]) == [NL2]
    assert forced(budget, [[Q, Q, OPEN, Q, 5, 6, 7, CLOSE, NL2]]) == [None]  # the answer is the model's own


def test_a_block_opened_in_the_completion_counts_from_its_think_token():
    budget = (Budget(2, OPEN, CLOSE, NL2), 4)
    assert forced(budget, [[P, Q, Q, Q, 9, 9, OPEN, 5]]) == [None]
    assert forced(budget, [[P, Q, Q, Q, 9, 9, OPEN, 5, 6]]) == [CLOSE]
    assert forced(budget, [[P, Q, Q, Q]]) == [None]  # no block at all: untouched


def test_a_block_closed_before_the_budget_is_left_alone():
    budget = (Budget(3, OPEN, CLOSE, NL2), 3)
    assert forced(budget, [[Q, OPEN, Q, 5, CLOSE]]) == [None]  # closed by the model after 2: no "\n\n" forced
    assert forced(budget, [[Q, OPEN, Q, 5, CLOSE, 8, 9, 10, 11]]) == [None]  # long answers are not thinking
    # a prompt with an earlier, closed block (a history turn) opens nothing
    assert forced(budget, [[OPEN, CLOSE, Q, 5, 6, 7, 8]]) == [None]


def test_a_batch_with_mixed_states_is_forced_row_by_row():
    budget = (Budget(2, OPEN, CLOSE, NL2), 3)
    rows = [[Q, Q, OPEN, 5, 6],        # opened in the prompt, at the budget: close
            [P, Q, OPEN, 5, CLOSE],     # closed by the model before the budget: free
            [Q, Q, Q, OPEN, 5],         # opened in the completion, 1 of 2: free
            [Q, OPEN, Q, 5, 6],         # (prompt [Q, OPEN, Q]) two generated: close
            [Q, Q, OPEN, 5, 6]]
    assert forced(budget, rows) == [CLOSE, None, None, CLOSE, CLOSE]
    rows = [[Q, Q, OPEN, 5, 6, CLOSE], [P, Q, Q, 5, 6, 7], [Q, Q, OPEN, 5, CLOSE, 9]]
    assert forced(budget, rows) == [NL2, None, None]
    without_after = (Budget(2, OPEN, CLOSE), 3)
    assert forced(without_after, [[Q, Q, OPEN, 5, 6, CLOSE]]) == [None]


def test_a_budget_needs_the_thinking_tokens_and_zero_is_none(thinking_processor):
    assert engine.budget_of(thinking_processor, 0) is None
    assert engine.budget_of(thinking_processor, 8) == Budget(8, OPEN, CLOSE, NL2)
    with pytest.raises(ValueError, match="must be >= 0"):
        thinking.budget_ids(thinking_processor, -1)
    with pytest.raises(ValueError, match="needs a tokenizer with <think>"):
        thinking.budget_ids(_NoThinkTokenizer(), 8)


class _NoThinkTokenizer:
    unk_token_id = None

    def convert_tokens_to_ids(self, token):
        return None


def test_thinking_of_counts_the_block_and_whether_the_budget_cut_it():
    ids = (OPEN, CLOSE)
    assert thinking.thinking_of([5, 6, CLOSE, NL2, 9], ids, opened=True, budget=2) == {
        "thinking_tokens": 2, "thinking_closed": True, "thinking_cut": True}
    assert thinking.thinking_of([5, CLOSE, 9], ids, opened=True, budget=2)["thinking_cut"] is False
    assert thinking.thinking_of([1, OPEN, 5, 6, 7], ids, opened=False, budget=8) == {
        "thinking_tokens": 3, "thinking_closed": False, "thinking_cut": False}
    assert thinking.thinking_of([1, 2], ids, opened=False) == {} == thinking.thinking_of([1], None, opened=True)


# --- the setting and the preset ----------------------------------------------------------------------------------
def test_the_thinking_preset_is_the_8b_recipe_with_a_budget_that_leaves_room_for_the_answer():
    thinker, instruct = cfg.preset("qwen3-vl-8b-thinking-mathvista"), cfg.preset("qwen3-vl-8b-mathvista")
    changed = {(section, key) for section, values in thinker.to_dict().items() if isinstance(values, dict)
               for key, value in values.items() if instruct.to_dict()[section][key] != value}
    # rollouts decode 8 at a time, not the 8B's 16 (its step at 8 already reserved 18.8 GiB on NF4,
    # bench/results/rehearsal.md), and train 2 completions a forward, not 4 (at 1,536 tokens 4 reserved 23.4 GiB on
    # the int8 base, 2 17.8: bench/results/engine.md), accumulating twice as many for the recipe's 32 a step; its
    # evals decode 16 at a time, not 32 (at 32 the baseline eval ran out of memory under a hard 23 GiB cap,
    # bench/results/capped.md); and its passes stay the micro-batches (pass_tokens 0: the 8B's 12,288 was measured at
    # 1,024 tokens, not at this shape: docs/training.md)
    assert changed == {("model", "name_or_path"), ("training", "max_completion_length"),
                       ("training", "generation_batch_size"), ("training", "per_device_train_batch_size"),
                       ("training", "gradient_accumulation_steps"), ("training", "thinking_budget"),
                       ("training", "pass_tokens"),
                       ("eval", "max_new_tokens"), ("eval", "thinking_budget"), ("eval", "batch_size")}
    assert (thinker.eval.batch_size, instruct.eval.batch_size) == (16, 32)
    assert (thinker.training.generation_batch_size, instruct.training.generation_batch_size) == (8, 16)
    assert (thinker.training.pass_tokens, instruct.training.pass_tokens) == (0, 12288)
    t = thinker.training
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps == 32 and t.per_device_train_batch_size == 2
    assert thinker.model.name_or_path == "unsloth/Qwen3-VL-8B-Thinking-unsloth-bnb-4bit"
    t, e = thinker.training, thinker.eval
    assert (t.thinking_budget, e.thinking_budget) == (1024, 1024)
    assert t.max_completion_length - t.thinking_budget >= 512 and e.max_new_tokens == t.max_completion_length
    assert instruct.training.thinking_budget == instruct.eval.thinking_budget == 0  # off unless asked


def test_a_budget_must_leave_room_for_the_answer_and_applies_to_single_turn_runs():
    config = cfg.preset("tiny")
    config.training.thinking_budget, config.eval.thinking_budget = 30, -1
    problems = " ".join(problems_of(config))
    assert "max_completion_length = 40 leaves 10 tokens after thinking_budget = 30" in problems
    assert "[eval] thinking_budget = -1 must be 0 or more" in problems
    config.training.thinking_budget, config.eval.thinking_budget = 24, 24
    assert problems_of(config) == []
    episodes = cfg.preset("grid-tiny")
    episodes.training.thinking_budget = 8
    assert "[training] thinking_budget = 8 applies to single-turn runs" in " ".join(problems_of(episodes))


# --- rewards and records of a completion that thinks ------------------------------------------------------------
ANSWER = "<REASONING>4-1=3</REASONING><SOLUTION>3</SOLUTION>"


@pytest.mark.parametrize("completion,format_score,prediction", [
    # the thinking is not scored, even when it drafts tags of its own
    (f"<think>\nmaybe <SOLUTION>9</SOLUTION>\n</think>\n\n{ANSWER}", 2.0, "3"),
    # the prompt opened the block: only what follows </think> is the answer
    (f"maybe <SOLUTION>9</SOLUTION></think>\n\n{ANSWER}", 2.0, "3"),
    # the budget closed it mid-sentence: the same
    (f"<think>\nlet me cou</think>\n\n{ANSWER}", 2.0, "3"),
    # a thinking answer must still use the tags: the block is not a REASONING block
    ("<think>\n4-1=3</think>\n\n<SOLUTION>3</SOLUTION>", 1.0, "3"),
    # cut by the length limit inside the thinking: no answer
    ("<think>\nmaybe <SOLUTION>9</SOLUTION> or", 0.0, None),
])
def test_rewards_score_the_answer_after_the_thinking(completion, format_score, prediction):
    assert rewards.format_reward([completion]) == [format_score]
    assert rewards.correctness_parts(completion, "3")["prediction"] == prediction


def test_rewards_of_a_run_whose_prompt_opens_thinking_score_the_whole_turn(thinking_processor, tiny_processor):
    logged = {}
    funcs = thinking.with_thinking(rewards.reward_funcs(), thinking_processor, budget=2)
    assert [f.__name__ for f in funcs] == ["format_reward", "correctness_reward"]  # trainer logs keep the names
    cut_inside = "maybe <SOLUTION>3</SOLUTION> or"  # as TRL decodes it: the prompt's <think> is not in the text
    closed = f"hm</think>\n\n{ANSWER}"
    completion_ids = [[5, 6], [5, CLOSE, NL2, 9]]
    kwargs = {"answer": ["3", "3"], "completion_ids": completion_ids, "log_metric": logged.__setitem__}
    assert funcs[0]([cut_inside, closed], **kwargs) == [0.0, 2.0]
    assert funcs[1]([cut_inside, closed], **kwargs) == [0.0, 2.0]
    assert rewards.correctness_reward([cut_inside], answer=["3"]) == [2.0]  # what the unwrapped reward would say
    thinking_logged = {k: v for k, v in logged.items() if k.startswith("thinking/")}
    assert thinking_logged == {"thinking/tokens_mean": 1.5, "thinking/closed_rate": 0.5, "thinking/cut_rate": 0.0}
    plain = rewards.reward_funcs()
    assert thinking.with_thinking(plain, tiny_processor) is plain  # no thinking, no budget: unchanged


def test_a_thinking_record_rescores_to_its_stored_verdict():
    completion = f"<think>\nlet me cou</think>\n\n{ANSWER}"
    record = evaluate.to_record({"id": "q", "question": "4 - 1?", "answer": "3"}, completion, finish_reason="stop",
                                thinking_tokens=5, thinking_closed=True, thinking_cut=True, thinking_budget=5)
    assert (record["correct"], record["format_ok"], record["prediction"]) == (True, True, "3")
    assert record == {**record, **evaluate.rescore(json.loads(json.dumps(record)))}


# --- real generation on the tiny model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_thinker(tiny_dir, thinking_processor):
    policy, _ = model.load_model(str(tiny_dir), backend="transformers")
    return policy, thinking_processor


def _thinking_lengths(completions, budget):
    """Each completion's thinking length (the prompt opened the block), after checking what follows a budget close."""
    lengths = []
    for tokens in completions:
        end = tokens.index(CLOSE) if CLOSE in tokens else None
        thought = tokens[:end] if end is not None else [t for t in tokens if t not in (151645, 151643)]
        assert len(thought) <= budget, f"{len(thought)} thinking tokens over the budget {budget}: {tokens}"
        if end is not None and end == budget and len(tokens) > end + 1:
            assert tokens[end + 1] == NL2  # "\n\n", then the answer
        lengths.append(len(thought))
    return lengths


@pytest.mark.parametrize("static", [False, True])  # True: the static KV cache of the GPU's fast path
def test_generation_never_thinks_past_the_budget(tiny_thinker, static, monkeypatch):
    from vlrl.engine import loop

    monkeypatch.setattr(loop, "STATIC_ON_CPU", static)
    policy, processor = tiny_thinker
    budget, rows = 6, [prompts.to_prompt(i) for i in synthetic.generate(2, seed=3, image_size=64)]
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    assert all(t.endswith("<|im_start|>assistant\n<think>\n") for t in texts)
    decoding = engine.decoding_for(policy, processor, max_new_tokens=24, temperature=1.0, thinking_budget=budget,
                                   static=static)
    torch.manual_seed(0)
    completions = [c.ids for c in engine.complete(policy, processor, texts, [[r["image"]] for r in rows], decoding,
                                                  draws=3)]
    lengths = _thinking_lengths(completions, budget)
    cut = [c for c, n in zip(completions, lengths) if n == budget]
    assert len(completions) == 6 and cut  # the warm-started tiny model never closes a block itself: the budget does
    assert all(c[budget] == CLOSE for c in cut)
    assert any(len([t for t in c[budget + 2:] if t not in (151645, 151643)]) > 0 for c in cut)  # an answer follows


def test_eval_records_say_when_the_budget_cut_the_thinking(tiny_thinker, tmp_path):
    policy, processor = tiny_thinker
    rows = [prompts.to_prompt(i) for i in synthetic.generate(3, seed=4, image_size=64)]
    records = evaluate.evaluate(policy, processor, rows, tmp_path / "eval.jsonl", batch_size=3, max_new_tokens=30,
                                thinking_budget=5, progress=False)
    for record in records:
        assert record["completion"].startswith("<think>\n") and record["thinking_budget"] == 5
        assert record["thinking_tokens"] <= 5
        assert record["thinking_cut"] == (record["thinking_tokens"] == 5 and record["thinking_closed"])
        assert record == {**record, **evaluate.rescore(record)}  # the record alone scores the same
    assert any(r["thinking_cut"] for r in records)
    with pytest.raises(Exception, match="thinking_budget"):  # resuming under another budget mixes two evals
        evaluate.evaluate(policy, processor, rows, tmp_path / "eval.jsonl", batch_size=3, max_new_tokens=30,
                          progress=False)


@pytest.mark.slow
def test_gspo_rollouts_keep_the_budget_and_log_how_often_it_cut(tiny_dir, thinking_processor, tmp_path):
    config = cfg.preset("tiny")
    for key, value in {"max_steps": 1, "max_completion_length": 24, "thinking_budget": 4}.items():
        setattr(config.training, key, value)
    policy, _ = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    trainer = train.build_trainer(config, policy, thinking_processor,
                                  prompts.to_dataset(synthetic.generate(8, seed=5, image_size=64)), tmp_path)
    rollouts, generate = [], trainer.generate_rollouts

    def recorded(*args, **kwargs):
        completion_ids, logprobs = generate(*args, **kwargs)
        rollouts.extend(completion_ids)
        return completion_ids, logprobs

    trainer.generate_rollouts = recorded
    trainer.train()
    assert len(rollouts) == 8 and all(n <= 4 for n in _thinking_lengths(rollouts, 4))
    logged = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    step = next(r for r in logged if "thinking/cut_rate" in r)
    assert step["thinking/cut_rate"] > 0 and step["thinking/tokens_mean"] <= 4
