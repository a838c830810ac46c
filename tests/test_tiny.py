"""The tiny Qwen3-VL: real architecture, Qwen3-VL's token ids, loadable like a hub checkpoint, deterministic."""

import json

import pytest
import torch

from vlrl.model import tiny

QWEN3_VL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                "<|image_pad|>": 151655, "<think>": 151667, "</think>": 151668}


def test_special_tokens_have_qwen3_vl_ids(tiny_processor):
    tok = tiny_processor.tokenizer
    assert {t: tok.convert_tokens_to_ids(t) for t in QWEN3_VL_IDS} == QWEN3_VL_IDS
    assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643


def test_ordinary_text_gets_qwen_ids(tiny_processor):
    # Qwen2/3 BPE ids: "Hello"=9707, " world"=1879, digits are split one by one ("1"=16, ","=11).
    assert tiny_processor.tokenizer("Hello world 1,2").input_ids == [9707, 1879, 220, 16, 11, 17]
    text = "<REASONING>7 - 3 = 4</REASONING>"
    assert tiny_processor.tokenizer.decode(tiny_processor.tokenizer(text).input_ids) == text


def test_saved_like_a_hub_checkpoint(tiny_base_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    config = json.loads((tiny_base_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl"
    assert config["text_config"]["num_attention_heads"] == 4 and config["text_config"]["num_key_value_heads"] == 2
    assert config["text_config"]["rope_parameters"]["mrope_interleaved"] is True
    assert config["vision_config"]["deepstack_visual_indexes"] == [0, 1]
    model = AutoModelForImageTextToText.from_pretrained(tiny_base_dir)
    processor = AutoProcessor.from_pretrained(tiny_base_dir)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert type(processor).__name__ == "Qwen3VLProcessor"
    assert model.get_input_embeddings().weight.shape[0] == tiny.VOCAB_SIZE


def test_image_prompt_generates(tiny_base_dir, tiny_processor, items):
    from transformers import AutoModelForImageTextToText

    from vlrl.model.prompts import to_prompt

    model = AutoModelForImageTextToText.from_pretrained(tiny_base_dir)
    row = to_prompt(items[0])
    text = tiny_processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    inputs = tiny_processor(text=[text], images=[row["image"]], return_tensors="pt")
    # a 64x64 image is 4x4 patches of 16 px, merged 2x2: 4 image tokens
    assert int((inputs["input_ids"] == 151655).sum()) == 4
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5


def test_same_seed_same_weights():
    from transformers import Qwen3VLForConditionalGeneration

    def weights(seed):
        torch.manual_seed(seed)
        return Qwen3VLForConditionalGeneration(tiny.tiny_config()).state_dict()

    a, b, c = weights(3), weights(3), weights(4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_a_missing_model_is_built_once_by_whoever_holds_its_lock(tmp_path):
    """`tiny.build_once`: the first to ask builds; one that asks while that build holds the lock waits for it and
    then finds the model built (a thread stands in for another process: each opens the lock file itself)."""
    import threading

    from filelock import FileLock

    final = tmp_path / "tiny-model"
    answers = []

    def ask():
        with tiny.build_once(final) as missing:
            answers.append(missing)

    with FileLock(tmp_path / ".tiny-model.lock"):  # another process's build, under way
        waiter = threading.Thread(target=ask)
        waiter.start()
        final.mkdir()
        (final / "config.json").write_text("{}")  # ... and in place
    waiter.join()
    assert answers == [False]
    with tiny.build_once(tmp_path / "other") as missing:
        assert missing


@pytest.mark.slow
def test_warm_start_teaches_the_format(tiny_dir, tiny_processor):
    """After the warm start, greedy answers carry the tags, and sampled answers differ in reward (GSPO's signal)."""
    from transformers import AutoModelForImageTextToText

    from vlrl.base import synthetic
    from vlrl.evaluation import evaluate
    from vlrl.model.prompts import to_dataset

    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    held_out = to_dataset(synthetic.generate(16, seed=777, image_size=64))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        greedy = evaluate.evaluate(model, tiny_processor, held_out, f"{tmp}/g.jsonl", batch_size=16,
                                   max_new_tokens=40, progress=False)
        sampled = evaluate.evaluate(model, tiny_processor, held_out, f"{tmp}/s.jsonl", batch_size=16,
                                    max_new_tokens=40, do_sample=True, progress=False)
    assert sum(r["format_ok"] for r in greedy) >= 12
    assert len({r["reward"] for r in sampled}) > 1
