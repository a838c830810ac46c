"""[model] memory_cap_gib: the cap's arithmetic, its refusals, and a CUDA out-of-memory error as one line."""

import pytest
import torch

from vlrl.base.errors import ConfigError
from vlrl.cli import main
from vlrl.config import runfile as cfg
from vlrl.config.validation import validate
from vlrl.model.memory_cap import GIB, cap_fraction, cap_memory


def test_the_cap_counts_what_sits_outside_the_allocator():
    # an H200 (about 140 GiB) with a 0.5 GiB context and 2 GiB reserved by this process's allocator
    total, free, reserved = 140 * GIB, int(137.5 * GIB), 2 * GIB
    fraction = cap_fraction(23 * GIB, total, free, reserved)
    assert fraction * total == pytest.approx(22.5 * GIB)  # 23 GiB less the context, the allocator's own 2 included
    with pytest.raises(ConfigError, match="in use outside this process's allocator"):
        cap_fraction(0.4 * GIB, total, free, reserved)
    with pytest.raises(ConfigError, match="more than this GPU has"):
        cap_fraction(200 * GIB, total, free, reserved)


def test_no_cap_is_a_no_op_and_a_cap_without_a_gpu_is_refused(monkeypatch):
    assert cap_memory(0) is None
    with pytest.raises(ConfigError, match="must be 0"):
        cap_memory(-1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="this machine has none"):
        cap_memory(23)


def test_validate_refuses_a_negative_cap():
    config = cfg.preset("tiny")
    config.model.memory_cap_gib = -2
    with pytest.raises(ConfigError, match="memory_cap_gib = -2 must be 0"):
        validate(config)
    config.model.memory_cap_gib = 23
    validate(config)


def test_the_model_loads_under_the_cap(monkeypatch, tiny_dir):
    """load_model sets the cap before the weights load (the allocator calls recorded, no GPU here)."""
    from vlrl.model.loading import load_model

    calls = []
    monkeypatch.setattr("vlrl.model.loading.cap_memory", lambda gib, log=print: calls.append(gib))
    model, _ = load_model(str(tiny_dir), memory_cap_gib=23)
    assert calls == [23] and model is not None


def test_out_of_memory_is_one_line_with_the_fix(monkeypatch, capsys):
    from vlrl import cli

    def out_of_memory(args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.00 GiB allowed)")

    monkeypatch.setitem(cli.HANDLERS, "presets", out_of_memory)
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vlrl presets: out of GPU memory (CUDA out of memory.")
    assert "generation_batch_size" in err and "What was written stays" in err
