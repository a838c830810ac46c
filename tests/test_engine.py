"""The decoding engine (`vlrl.engine`) on the tiny Qwen3-VL: its greedy tokens are transformers' `generate`'s, with a
dynamic cache and with the static cache of the GPU's fast path (run eager here), with rows padded to a fixed batch;
its recorded log-probs are those of the distribution it drew from; its draws follow that distribution; stopped rows
hold the pad token. The thinking budget's tests are in test_thinking.py, the rollouts' in test_mismatch.py and
test_episodes.py."""

import time
from dataclasses import replace

import pytest
import torch

from vlrl import engine
from vlrl.base import synthetic
from vlrl.engine import loop
from vlrl.engine.sampling import TokenChooser
from vlrl.model import loading as model
from vlrl.model import prompts


@pytest.fixture(scope="module")
def policy(tiny_dir):
    return model.load_model(str(tiny_dir), backend="transformers")


@pytest.fixture(scope="module")
def contexts(policy):
    _, processor = policy
    rows = [prompts.to_prompt(item) for item in synthetic.generate(3, seed=11, image_size=64)]
    rows[1]["prompt"][0]["content"][-1]["text"] += " Think about it carefully, step by step."  # lengths differ
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return texts, [[r["image"]] for r in rows]


def _generate(policy, texts, images, decoding: engine.Decoding) -> list[list[int]]:
    """transformers' own greedy `generate`, cut as the engine cuts (after the stop token)."""
    tiny, processor = policy
    processor.tokenizer.padding_side = "left"
    inputs = processor(text=texts, images=[i for group in images for i in group], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = tiny.generate(**inputs, max_new_tokens=decoding.max_new_tokens, do_sample=False, top_p=None, top_k=None,
                            eos_token_id=list(decoding.stop_ids), pad_token_id=decoding.pad_id,
                            suppress_tokens=list(decoding.suppress_ids))
    rows = []
    for row in out[:, inputs["input_ids"].shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in decoding.stop_ids), None)
        rows.append(row if end is None else row[:end + 1])
    return rows


@pytest.mark.parametrize("static", [False, True])
def test_greedy_decoding_gives_generates_tokens(policy, contexts, static, monkeypatch):
    monkeypatch.setattr(loop, "STATIC_ON_CPU", static)
    tiny, processor = policy
    texts, images = contexts
    decoding = engine.decoding_for(tiny, processor, max_new_tokens=40, static=static)
    completions = engine.complete(tiny, processor, texts, images, decoding)
    expected = _generate(policy, texts, images, decoding)
    assert [c.ids for c in completions] == expected
    assert any(c.finish_reason == "stop" for c in completions)  # the warm-started model ends its answers
    for c in completions:
        assert (c.finish_reason == "stop") == (c.ids[-1] in decoding.stop_ids)
        assert c.text == processor.tokenizer.decode(c.ids, skip_special_tokens=True)


def test_decoding_steps_attend_through_the_grouped_attention_and_training_does_not(policy, contexts, monkeypatch):
    """Each decoding step of the static path (one query position) reads each key/value head once
    (`vlrl.engine.attention`); the prefill, and every forward outside a decode, go through transformers' SDPA."""
    from vlrl.engine import attention

    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    tiny, processor = policy
    texts, images = contexts
    calls = []
    original = attention.grouped_decode_attention

    def spy(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "grouped_decode_attention", spy)
    decoding = replace(engine.decoding_for(tiny, processor, max_new_tokens=6, static=True), stop_ids=())
    engine.complete(tiny, processor, texts[:2], images[:2], decoding)
    layers = tiny.config.get_text_config().num_hidden_layers
    assert calls.count(1) == 5 * layers and len(calls) == 6 * layers  # 5 steps after the prefill, every layer
    assert tiny.config.get_text_config()._attn_implementation == "sdpa"  # back to SDPA after the decode
    calls.clear()
    with torch.no_grad():
        tiny(**processor(text=texts[:1], images=images[0], return_tensors="pt"))
    assert calls == []


def test_a_batch_padded_to_fixed_rows_decodes_the_same(policy, contexts, monkeypatch):
    """A static batch keeps its rows (one compiled shape): the filler rows change nothing in the real ones."""
    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    tiny, processor = policy
    texts, images = contexts
    seen = []

    def recorded(*args, **kwargs):
        out = loop.decode(*args, **kwargs)
        seen.append(out.stats)
        return out

    monkeypatch.setattr(engine, "decode", recorded)
    decoding = engine.decoding_for(tiny, processor, max_new_tokens=24, static=True)
    alone = engine.complete(tiny, processor, texts[:2], images[:2], decoding)
    padded = engine.complete(tiny, processor, texts[:2], images[:2], replace(decoding, rows=5))
    assert [c.ids for c in padded] == [c.ids for c in alone] and len(padded) == 2
    assert [s["rows"] for s in seen] == [2, 5] and seen[0]["cache_length"] % loop.CACHE_BUCKET == 0


def test_recorded_logps_are_of_the_distribution_drawn_from(policy, contexts):
    """At temperature 2 with the vision placeholders suppressed, each recorded log-prob is what a full forward over
    context + completion gives for that token under the same processing."""
    tiny, processor = policy
    texts, images = contexts
    decoding = engine.decoding_for(tiny, processor, max_new_tokens=16, temperature=2.0, record_logps=True)
    torch.manual_seed(0)
    completions = engine.complete(tiny, processor, texts[:2], images[:2], decoding)
    for text, pictures, c in zip(texts, images, completions):
        assert len(c.logps) == len(c.ids)
        inputs = processor(text=[text], images=pictures, return_tensors="pt")
        ids = torch.cat([inputs["input_ids"], torch.tensor([c.ids])], dim=1)
        types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(c.ids), dtype=torch.long)], dim=1)
        with torch.no_grad():
            logits = tiny(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                          image_grid_thw=inputs["image_grid_thw"], mm_token_type_ids=types).logits
        logits = logits[0, inputs["input_ids"].shape[1] - 1:-1].float()
        logits[:, list(decoding.suppress_ids)] = float("-inf")
        expected = (logits / 2.0).log_softmax(-1).gather(1, torch.tensor(c.ids).unsqueeze(1)).squeeze(1)
        assert c.logps == pytest.approx(expected.tolist(), abs=1e-4)


def test_draws_follow_the_distribution_and_a_seed_repeats_them():
    scores = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [0.0] * 300])).repeat(20000, 1)  # 20,000 draws: 3 sigma < 0.01
    torch.manual_seed(0)
    tokens = TokenChooser(torch.zeros(20000, 1, dtype=torch.long), stop_ids=[5], temperature=1.0)(scores)
    frequencies = torch.bincount(tokens, minlength=3)[:3] / 20000
    assert frequencies.tolist() == pytest.approx([0.7, 0.2, 0.1], abs=0.01)
    torch.manual_seed(0)
    again = TokenChooser(torch.zeros(20000, 1, dtype=torch.long), stop_ids=[5], temperature=1.0)(scores)
    assert torch.equal(tokens, again)
    hot = TokenChooser(torch.zeros(20000, 1, dtype=torch.long), stop_ids=[5], temperature=2.0)(scores)
    flat = (torch.tensor([0.7, 0.2, 0.1]) ** 0.5) / (torch.tensor([0.7, 0.2, 0.1]) ** 0.5).sum()
    assert (torch.bincount(hot, minlength=3)[:3] / 20000).tolist() == pytest.approx(flat.tolist(), abs=0.01)


def test_stopped_rows_hold_the_pad_token_and_draws_stay_on_the_logits_device():
    chooser = TokenChooser(torch.zeros(2, 1, dtype=torch.long), stop_ids=[2], pad_id=9)
    assert chooser(torch.tensor([[0.0, 0.0, 5.0], [3.0, 0.0, 0.0]])).tolist() == [2, 0]
    assert chooser(torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])).tolist() == [9, 1]
    assert chooser.stopped.tolist() == [True, False]
    # the draw is made where the logits are (a CPU draw against CUDA logits once stopped a GSPO step on the GPU);
    # the meta device stands in for CUDA here
    meta = TokenChooser(torch.zeros(2, 1, dtype=torch.long, device="meta"), stop_ids=[1], temperature=1.0)
    assert meta(torch.zeros(2, 3000, device="meta")).device.type == "meta"


def test_draws_of_one_context_are_consecutive_rows(policy, contexts):
    tiny, processor = policy
    texts, images = contexts
    decoding = engine.decoding_for(tiny, processor, max_new_tokens=8, temperature=1.0)
    torch.manual_seed(3)
    completions = engine.complete(tiny, processor, texts[:2], images[:2], decoding, draws=3)
    assert len(completions) == 6
    lengths = [c.prompt_tokens for c in completions]
    assert lengths[:3] == [lengths[0]] * 3 and lengths[3:] == [lengths[3]] * 3 and lengths[0] != lengths[3]


def test_lora_weights_rounded_once_per_decode_give_the_autocast_numbers_and_come_back_untouched():
    """The static path's decode multiplies by the fp32 LoRA weights rounded to bf16 once (`loop.half_trainables`):
    the same outputs as autocast rounding them in every matmul, the same buffers on every entry (the CUDA graph's
    addresses), refreshed after an optimizer step, and the fp32 weights themselves back after it."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).to(torch.bfloat16)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["0", "2"], init_lora_weights=False))
    trainable = [w for w in lora.parameters() if w.requires_grad]
    assert len(trainable) == 4 and all(w.dtype == torch.float32 for w in trainable)
    fp32 = [(w.data_ptr(), w.detach().clone()) for w in trainable]
    x = torch.randn(3, 16, dtype=torch.bfloat16)

    def run():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return lora(x)

    expected = run()
    with loop.half_trainables(lora, torch.bfloat16):
        assert all(w.dtype == torch.bfloat16 for w in trainable)
        assert torch.equal(run(), expected)
        buffers = [w.data_ptr() for w in trainable]
    assert all(w.data_ptr() == ptr and torch.equal(w, value) for w, (ptr, value) in zip(trainable, fp32))

    optimizer = torch.optim.SGD(trainable, lr=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lora(x).float().square().sum().backward()
    optimizer.step()
    moved = run()
    assert not torch.equal(moved, expected)
    with loop.half_trainables(lora, torch.bfloat16):
        assert [w.data_ptr() for w in trainable] == buffers  # refilled in place
        assert torch.equal(run(), moved)


def test_lora_layers_fed_one_input_decode_as_one_pair(tiny_dir, contexts, monkeypatch):
    """Over an unquantized base (each layer's own matmul), the static path still computes the LoRA of q/k/v and of
    gate/up as one pair (`vlrl.engine.fusion`): the same greedy tokens as layer by layer, and each grouped layer's
    own LoRA matrices untouched in the steps."""
    from vlrl.engine import fusion
    from vlrl.model.loading import LoraSettings, add_lora

    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    tiny, processor = model.load_model(str(tiny_dir), backend="transformers")
    texts, images = contexts
    engine.complete(tiny, processor, texts[:1], images[:1], engine.decoding_for(tiny, processor, max_new_tokens=2))
    assert fusion.groups(tiny) == []  # a baseline eval before LoRA: nothing to group, and looked for again after
    policy = add_lora(tiny, LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    decoding = replace(engine.decoding_for(policy, processor, max_new_tokens=16, static=True), stop_ids=())
    monkeypatch.setattr(fusion, "ENABLED", False)
    layer_by_layer = engine.complete(policy, processor, texts, images, decoding)
    monkeypatch.setattr(fusion, "ENABLED", True)
    engine.complete(policy, processor, texts, images, decoding)  # finds the groups in its prefill
    groups = fusion.groups(policy.get_base_model())
    assert len(groups) == 2 * tiny.config.get_text_config().num_hidden_layers and all(g.base is None for g in groups)
    follower = groups[0].members[1].lora_A["default"]
    calls = []
    follower.register_forward_hook(lambda *_: calls.append(1))
    grouped = engine.complete(policy, processor, texts, images, decoding)
    assert [c.ids for c in grouped] == [c.ids for c in layer_by_layer]
    assert calls == [1]  # the prefill only: the steps computed k's LoRA inside the group's pair


def test_a_decode_times_its_prefill_and_its_steps(policy, contexts):
    """`Decoded.stats` holds the prefill's seconds and the decoding steps' (the host's clock on a CPU, CUDA events on
    a GPU), what a GSPO step logs as `rollout/prefill_time` and `rollout/decode_ms_per_step`."""
    tiny, processor = policy
    texts, images = contexts
    inputs = prompts.batch_inputs(processor, texts, [i for group in images for i in group], padding_side="left")
    decoding = engine.decoding_for(tiny, processor, max_new_tokens=12)
    started = time.perf_counter()
    out = engine.decode(tiny, dict(inputs), decoding)
    whole = time.perf_counter() - started
    assert out.stats["steps"] > 0 and 0 < out.stats["prefill_s"] and 0 < out.stats["decode_s"]
    assert out.stats["prefill_s"] + out.stats["decode_s"] <= whole
    marks = loop.Marks(cuda=False)
    for pause in (0.0, 0.05, 0.01):
        time.sleep(pause)
        marks.mark()
    first, second = marks.seconds()
    assert 0.05 <= first < 0.5 and 0.01 <= second < first
