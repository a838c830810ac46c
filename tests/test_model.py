"""Backend selection, the family table and LoRA targets, on the tiny Qwen3-VL and a tiny Qwen2.5-VL."""

import re
import sys

import pytest
import torch

from vlrl.model import loading as model


@pytest.mark.parametrize("backend,cuda,installed,expected", [
    ("auto", True, True, "transformers"),  # the fastest measured GPU path (bench/results/gpu.md); Unsloth is opt-in
    ("auto", True, False, "transformers"),  # no gpu extra: transformers + PEFT + bitsandbytes
    ("auto", False, True, "transformers"),  # Unsloth needs CUDA
    ("auto", False, False, "transformers"),
    ("transformers", True, True, "transformers"),  # a named backend is used as given
    ("unsloth", True, True, "unsloth"),
])
def test_choose_backend_selection(backend, cuda, installed, expected):
    assert model.choose_backend(backend, cuda=cuda, unsloth_installed=installed) == expected


def test_forcing_unsloth_where_it_cannot_run_says_why():
    with pytest.raises(ValueError, match="needs a CUDA GPU.*backend = \"transformers\""):
        model.choose_backend("unsloth", cuda=False, unsloth_installed=True)
    with pytest.raises(ImportError, match=r"pip install 'vlrl\[gpu\]'"):
        model.choose_backend("unsloth", cuda=True, unsloth_installed=False)
    with pytest.raises(ValueError, match="'vllm' is unknown"):
        model.choose_backend("vllm")


def test_auto_backend_on_this_cpu_machine_is_transformers_without_importing_unsloth():
    assert model.activate_backend("auto") == "transformers"
    assert "unsloth" not in sys.modules


def test_load_model_refuses_unsloth_on_cpu_before_loading_anything(tiny_base_dir):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        model.load_model(str(tiny_base_dir), lora=model.LoraSettings(), backend="unsloth")


@pytest.fixture(scope="module")
def tiny_qwen3(tiny_base_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_base_dir)


@pytest.fixture(scope="module")
def tiny_qwen25():
    """A random Qwen2.5-VL at tiny sizes, built from its transformers config (no hub)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 0, "eos_token_id": 1,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 64,
                       "fullatt_block_indexes": [1], "window_size": 32, "patch_size": 14, "spatial_merge_size": 2},
        bos_token_id=0, eos_token_id=1)
    return Qwen2_5_VLForConditionalGeneration(config)


def _targets(m, **kwargs) -> list[str]:
    regex = model.lora_target_regex(m, **kwargs)
    return [n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and re.fullmatch(regex, n)]


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_qwen25"])
def test_lora_targets_by_default_are_the_language_models_attention_and_mlp(family, request):
    m = request.getfixturevalue(family)
    targets = _targets(m)
    layers = m.config.get_text_config().num_hidden_layers
    assert len(targets) == layers * len(model.LANGUAGE_TARGETS)
    assert all(t.startswith("model.language_model.layers.") for t in targets)


@pytest.mark.parametrize("family,projector", [
    ("tiny_qwen3", {"model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2",
                    "model.visual.deepstack_merger_list.0.linear_fc1",
                    "model.visual.deepstack_merger_list.1.linear_fc2"}),
    ("tiny_qwen25", {"model.visual.merger.mlp.0", "model.visual.merger.mlp.2"}),
])
def test_lora_projector_and_vision_targets_when_asked(family, projector, request):
    m = request.getfixturevalue(family)
    language = set(_targets(m))
    with_projector = set(_targets(m, train_projector=True))
    assert projector <= with_projector - language
    assert all("merger" in t for t in with_projector - language)
    vision = set(_targets(m, finetune_vision_layers=True)) - language
    assert vision and all(t.startswith("model.visual.blocks.") for t in vision)
    assert {"attn.qkv", "attn.proj"} <= {t.split(".", 4)[-1] for t in vision}


def test_lora_targets_head_adapts_the_lm_head_alone_or_with_the_layers(tiny_qwen3):
    layers = set(_targets(tiny_qwen3))
    assert _targets(tiny_qwen3, language="head") == ["lm_head"]
    assert set(_targets(tiny_qwen3, language="layers+head")) == layers | {"lm_head"}


def test_unknown_family_is_an_error_naming_it(tiny_qwen3, monkeypatch):
    monkeypatch.delitem(model.FAMILIES, "qwen3_vl")
    with pytest.raises(ValueError, match="unsupported model family 'qwen3_vl'.*vlrl.model.loading.FAMILIES"):
        model.lora_target_regex(tiny_qwen3)


def test_wrong_module_path_in_the_family_table_is_an_error_naming_it(tiny_qwen3, monkeypatch):
    monkeypatch.setitem(model.FAMILIES, "qwen3_vl", {**model.FAMILIES["qwen3_vl"], "language_model": "model.text"})
    with pytest.raises(ValueError, match="no module 'model.text'.*language model"):
        model.lora_target_regex(tiny_qwen3)
    monkeypatch.setitem(model.FAMILIES, "qwen3_vl", {**model.FAMILIES["qwen3_vl"], "language_model":
                                                     "model.language_model", "projector": r"mm_projector\.\d"})
    with pytest.raises(ValueError, match=r"matches .*mm_projector.*projector targets"):
        model.lora_target_regex(tiny_qwen3, train_projector=True)


def test_load_model_freezes_vision_and_seeds_the_lora_init(tiny_base_dir):
    first, _ = model.load_model(str(tiny_base_dir), lora=model.LoraSettings(seed=3), backend="transformers")
    again, _ = model.load_model(str(tiny_base_dir), lora=model.LoraSettings(seed=3), backend="transformers")
    summary = model.trainable_summary(first)
    assert summary["backend"] == "transformers"
    assert not summary["vision_trainable"] and not summary["projector_trainable"]
    trained = [n for n, p in first.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n and ".language_model." in n for n in trained)
    a, b = dict(first.named_parameters()), dict(again.named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in trained)  # the same run file starts from the same adapter


def test_load_model_can_adapt_the_projector(tiny_base_dir):
    policy, _ = model.load_model(str(tiny_base_dir), lora=model.LoraSettings(train_projector=True))
    summary = model.trainable_summary(policy)
    assert summary["projector_trainable"] and not summary["vision_trainable"]


def test_add_lora_after_load_is_load_model_with_lora(tiny_base_dir):
    settings = model.LoraSettings(r=8, alpha=16, seed=5)
    at_once, _ = model.load_model(str(tiny_base_dir), lora=settings, backend="transformers")
    base, _ = model.load_model(str(tiny_base_dir), backend="transformers")
    assert all(p.requires_grad for p in base.parameters())  # plain: nothing frozen yet
    later = model.add_lora(base, settings)
    a, b = dict(at_once.named_parameters()), dict(later.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert {n for n, p in a.items() if p.requires_grad} == {n for n, p in b.items() if p.requires_grad}


def test_describe_counts_the_parts_before_and_after_lora(tiny_base_dir):
    base, _ = model.load_model(str(tiny_base_dir), backend="transformers")
    before = model.describe(base)
    total = sum(p.numel() for p in base.parameters())
    assert before["family"] == "qwen3_vl" and before["backend"] == "transformers" and not before["load_in_4bit"]
    assert before["parameters"] == total and before["dtype"] == "float32" and before["device"] == "cpu"
    assert before["vision_tower_parameters"] == sum(p.numel() for p in base.model.visual.parameters())
    assert before["language_model_parameters"] == sum(p.numel() for p in base.model.language_model.parameters())
    assert "lora_layers" not in before
    wrapped = model.add_lora(base, model.LoraSettings(r=4))
    after = model.describe(wrapped)
    assert after["parameters"] == total  # the adapter is not counted as model weights
    assert after["lora_layers"] == base.config.text_config.num_hidden_layers * len(model.LANGUAGE_TARGETS)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert after["trainable_parameters"] == trainable
    assert after["trainable_share"] == pytest.approx(trainable / total, abs=1e-6)
    assert after["vision_trainable"] is False and after["projector_trainable"] is False


def test_environment_names_the_stack_the_device_and_the_backend(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = model.environment("auto")
    assert env["torch"] == torch.__version__.split("+")[0] and env["backend"] == "transformers"
    assert env["device"].startswith("cuda: " if torch.cuda.is_available() else "cpu (")
    assert env["hub"].startswith("offline")
    if not torch.cuda.is_available():
        assert model.environment("unsloth")["backend"].startswith("cannot run: backend 'unsloth' needs a CUDA GPU")
