"""The decoding engine's process-wide switches come back as they were on every way out of a decode, an exception
thrown inside included: the LoRA weights' fp32 tensors (`half_trainables`), `weights.KERNELS`, gemlite's split-K
setting, the quantizer's class and dynamo's recompile limit (issue 47, point 8)."""

import sys
import types

import pytest
import torch

from vlrl.engine import loop, weights


class Interrupted(Exception):
    pass


def test_half_trainables_puts_back_the_weights_swapped_before_a_failure(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    before = {name: (p.dtype, p.data_ptr()) for name, p in model.named_parameters()}
    real, calls = torch.empty_like, []

    def out_of_memory_at_the_third(*args, **kwargs):  # the third rounded buffer does not fit
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "empty_like", out_of_memory_at_the_third)
    with pytest.raises(torch.OutOfMemoryError), loop.half_trainables(model, torch.bfloat16):
        pass
    assert len(calls) == 3  # two weights were swapped to bf16 before the failure
    assert {name: (p.dtype, p.data_ptr()) for name, p in model.named_parameters()} == before


def test_half_trainables_puts_back_the_weights_when_the_decode_fails():
    model = torch.nn.Linear(4, 2)
    address = model.weight.data_ptr()
    with pytest.raises(Interrupted), loop.half_trainables(model, torch.bfloat16):
        assert model.weight.dtype == torch.bfloat16
        raise Interrupted
    assert model.weight.data_ptr() == address and model.weight.dtype == torch.float32


def test_without_kernels_is_undone_by_an_exception():
    assert weights.KERNELS
    with pytest.raises(Interrupted), weights.without_kernels():
        assert not weights.KERNELS
        raise Interrupted
    assert weights.KERNELS


@pytest.fixture
def gemlite_setting(monkeypatch):
    """gemlite's module that holds its split-K switch (gemlite needs CUDA and Triton: not installable here), as
    0.6.0.post2 defines it: the switch at gemlite's own default."""
    kernels = types.ModuleType("gemlite.triton_kernels.utils")
    setattr(kernels, weights.SPLITK_SETTING, True)
    monkeypatch.setitem(sys.modules, "gemlite.triton_kernels.utils", kernels)
    return kernels


def test_gemlite_split_k_setting_holds_for_the_block_only(gemlite_setting):
    with pytest.raises(Interrupted), weights.fp32_splitk_sums():
        assert getattr(gemlite_setting, weights.SPLITK_SETTING) is False  # fp32 sums while inside
        raise Interrupted
    assert getattr(gemlite_setting, weights.SPLITK_SETTING) is True  # gemlite's own default for everyone else


@pytest.mark.slow
def test_a_compiled_decodes_switches_are_restored_after_an_exception_inside(tiny_base_dir, gemlite_setting,
                                                                            monkeypatch):
    """`_decode_mode` as the static path on a GPU enters it (the CPU runs the same context managers), with a 4-bit
    quantizer on the model, and the decode failing inside."""
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    from vlrl.model.loading import load_model

    model, _ = load_model(str(tiny_base_dir), backend="transformers")
    quantizer = model.hf_quantizer = Bnb4BitHfQuantizer(BitsAndBytesConfig(load_in_4bit=True))
    limit = 8
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", limit)
    text = model.config.get_text_config()
    attention = text._attn_implementation
    for _ in range(2):  # twice: the quantizer's compileable class is the same object at each decode
        with pytest.raises(Interrupted), loop._decode_mode(model, static=True, cuda=True):
            assert quantizer.is_compileable and isinstance(quantizer, Bnb4BitHfQuantizer)
            assert torch._dynamo.config.recompile_limit == loop.RECOMPILE_LIMIT
            assert getattr(gemlite_setting, weights.SPLITK_SETTING) is False
            marked = type(quantizer)
            raise Interrupted
        assert type(quantizer) is Bnb4BitHfQuantizer and not quantizer.is_compileable
        assert torch._dynamo.config.recompile_limit == limit
        assert getattr(gemlite_setting, weights.SPLITK_SETTING) is True
        assert text._attn_implementation == attention
    assert marked is loop._compileable(Bnb4BitHfQuantizer)
