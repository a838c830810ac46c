"""The fused NF4 decode kernel (`tests/nf4_decode.py`: no run uses it, so it lives beside this test) against bitsandbytes'
own dequantize + matmul: the packed layout, ragged tiles, split K, double quantization, bias, `fused_decode` on
bitsandbytes layers under PEFT LoRA, and the custom op under torch.compile. Without a GPU the kernel runs in triton's
interpreter on CPU tensors."""

import os
from collections import OrderedDict

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when nf4_decode defines the kernel

pytest.importorskip("triton", reason="the fused kernel is a triton kernel (triton ships with CUDA builds of torch)")
bnb = pytest.importorskip("bitsandbytes", reason="the kernel reads bitsandbytes' 4-bit weights: pip install 'vlrl[gpu]'")
import nf4_decode  # tests/nf4_decode.py
from bitsandbytes import functional as F

if DEVICE == "cpu" and not nf4_decode.INTERPRET:
    pytest.skip("nf4_decode was imported before TRITON_INTERPRET=1 was set: the kernel has no CPU path then",
                allow_module_level=True)


def quantized(n: int, k: int, nested: bool, seed: int = 0):
    """A random bf16 [n, k] weight, 4-bit NF4 as bitsandbytes stores it: packed bytes and their QuantState."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEVICE)
    return F.quantize_4bit(w, blocksize=64, compress_statistics=nested, quant_type="nf4")


def linear4bit(k: int, n: int, nested: bool = True, seed: int = 0) -> "bnb.nn.Linear4bit":
    """A bitsandbytes NF4 layer with bf16 weights and bias, as a 4-bit policy's layers are loaded."""
    g = torch.Generator().manual_seed(seed)
    layer = bnb.nn.Linear4bit(k, n, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4",
                              compress_statistics=nested)
    layer.weight = bnb.nn.Params4bit(torch.randn(n, k, generator=g).to(torch.bfloat16), requires_grad=False,
                                     compress_statistics=nested, quant_type="nf4")
    layer.bias = torch.nn.Parameter(torch.randn(n, generator=g).to(torch.bfloat16))
    layer.support_avx512bf16_for_cpu = False  # bitsandbytes would repack the weight for its CPU kernel
    return layer.to(DEVICE)


def assert_bf16_close(actual: torch.Tensor, expected: torch.Tensor):
    """Equal up to the output's rounding to bf16 (and fp32 sums in another order): half a bf16 step is 0.4%."""
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-2, atol=1e-2 * expected.abs().max().item())


def test_layout_is_high_nibble_first_with_per_64_block_scales():
    # what the kernel assumes, against bitsandbytes' own dequantize: element 2j is byte j's high nibble
    packed, state = quantized(8, 128, nested=True)
    byte = packed.reshape(-1).long()
    codes = torch.stack([byte >> 4, byte & 15], dim=1).reshape(-1)
    scales = nf4_decode.block_scales(state).repeat_interleave(64)
    by_hand = (state.code[codes] * scales).to(torch.bfloat16).reshape(8, 128)
    assert torch.equal(by_hand, F.dequantize_4bit(packed, state))


# M: one sequence, a decode batch, a ragged one, a larger batch; (N, K): N not a multiple of BLOCK_N (64), K a multiple
# of 64 but not of BLOCK_K (128 and 256 here), split in 2 (`launch_config` with the interpreter's 8 programs)
@pytest.mark.parametrize("m", [1, 8, 13, 32])
@pytest.mark.parametrize("n,k", [(72, 192), (100, 320)])
@pytest.mark.parametrize("nested", [True, False])
def test_kernel_matches_dequantize_then_matmul(m, n, k, nested):
    packed, state = quantized(n, k, nested)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16).to(DEVICE)
    y = torch.ops.vlrl.nf4_matmul(x, packed.reshape(-1), nf4_decode.block_scales(state), state.code, None, n)
    assert y.shape == (m, n)
    assert_bf16_close(y, x.float() @ F.dequantize_4bit(packed, state).float().T)


def test_launch_config_splits_k_until_the_gpu_is_full():
    h100 = 2 * 132
    assert nf4_decode.launch_config(72, 192, 8) == {"BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 2, "num_warps": 4,
                                                     "num_stages": 3}
    assert nf4_decode.launch_config(100, 320, 8)["SPLIT_K"] == 2  # BLOCK_K 256: two chunks, a ragged second
    # the 8B's projections: k/v (1024 x 4096), q/o (4096 x 4096), gate/up (12288 x 4096), down (4096 x 12288)
    splits = {shape: nf4_decode.launch_config(*shape, h100)["SPLIT_K"]
              for shape in [(1024, 4096), (4096, 4096), (12288, 4096), (4096, 12288)]}
    assert splits == {(1024, 4096): 16, (4096, 4096): 8, (12288, 4096): 2, (4096, 12288): 8}
    assert nf4_decode.launch_config(64, 256, h100)["SPLIT_K"] == 1  # never more splits than K has chunks


def test_bias_and_leading_dimensions():
    layer = linear4bit(192, 72)
    x = torch.randn(2, 3, 192).to(torch.bfloat16).to(DEVICE)
    with torch.no_grad():
        assert nf4_decode.fits(x, layer)
        expected = layer(x)
        y = nf4_decode.nf4_linear(x, layer)
    assert y.shape == (2, 3, 72)
    assert_bf16_close(y, expected)


def test_falls_back_where_the_kernel_does_not_apply(monkeypatch):
    layer = linear4bit(128, 64)
    decode, prefill = torch.randn(4, 128).to(torch.bfloat16), torch.randn(65, 128).to(torch.bfloat16)
    with torch.no_grad():
        assert nf4_decode.fits(decode, layer) and not nf4_decode.fits(prefill, layer)
        monkeypatch.setattr(layer.weight.quant_state, "quant_type", "fp4")
        assert not nf4_decode.fits(decode, layer)
    assert not nf4_decode.fits(decode, linear4bit(128, 64))  # gradients on: training's path


def tiny_lora_model():
    """Two bitsandbytes NF4 layers under PEFT LoRA, with nonzero adapters so that they count in the output."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict(up=linear4bit(128, 192, seed=1), act=torch.nn.ReLU(),
                                            down=linear4bit(192, 64, nested=False, seed=2)))
    model = get_peft_model(model, LoraConfig(target_modules=["up", "down"], r=4, init_lora_weights=False))
    return model.to(torch.bfloat16)


def test_fused_decode_patches_the_base_layers_and_restores_them(monkeypatch):
    model = tiny_lora_model()
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    x = torch.randn(8, 128).to(torch.bfloat16).to(DEVICE)
    with torch.no_grad():
        expected = model(x)
    calls = []
    fused = torch.ops.vlrl.nf4_matmul
    monkeypatch.setattr(torch.ops.vlrl, "nf4_matmul", lambda *args: calls.append(1) or fused(*args))
    with nf4_decode.fused_decode(model) as patched:
        assert patched == 2 and all("forward" in m.__dict__ for m in layers)
        with torch.no_grad():
            y = model(x)
        assert len(calls) == 2
        model(x)  # gradients on: bitsandbytes' path
        assert len(calls) == 2
    assert_bf16_close(y, expected)
    assert not any("forward" in m.__dict__ or "_vlrl_nf4" in m.__dict__ for m in layers)


def test_fused_decode_restores_the_layers_after_an_exception():
    model = tiny_lora_model()
    with pytest.raises(RuntimeError, match="inside"), nf4_decode.fused_decode(model):
        raise RuntimeError("inside")
    assert not any("forward" in m.__dict__ for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))


def test_nf4_linear_compiles_to_one_op():
    layer = linear4bit(192, 72)
    x = torch.randn(5, 192).to(torch.bfloat16).to(DEVICE)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    compiled = torch.compile(lambda x: nf4_decode.nf4_linear(x, layer), backend=backend, fullgraph=True)
    with torch.no_grad():
        expected = nf4_decode.nf4_linear(x, layer)
        assert_bf16_close(compiled(x), expected)  # not bitwise on a GPU: split-K sums meet in atomic adds
        torch.library.opcheck(torch.ops.vlrl.nf4_matmul, (x, *nf4_decode._prepared(layer), layer.bias, 72),
                              test_utils=("test_schema", "test_faketensor"))
    assert [str(n.target) for n in graphs[0].graph.nodes].count("vlrl.nf4_matmul") == 1


TRACE_TRITON_OP = """
import torch
from functorch.compile import aot_function
from torch._subclasses.fake_tensor import FakeTensorMode
import nf4_decode  # tests/nf4_decode.py

graphs = []
traced = aot_function(lambda *args: torch.ops.vlrl.nf4_matmul(*args, 128),
                      fw_compiler=lambda gm, inputs: graphs.append(gm.code) or gm)
with FakeTensorMode():
    cuda = dict(device="cuda")
    y = traced(torch.empty(8, 256, dtype=torch.bfloat16, **cuda), torch.empty(128 * 128, dtype=torch.uint8, **cuda),
               torch.empty(128 * 4, **cuda), torch.empty(16, **cuda), torch.empty(128, dtype=torch.bfloat16, **cuda))
assert "triton_kernel_wrapper_functional" in graphs[0], graphs[0]
print(tuple(y.shape), y.dtype)
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU compiles the real thing in test_nf4_linear_compiles_to_one_op")
def test_the_gpu_triton_op_traces_into_the_kernel():
    # the triton_op the GPU registers (not the interpreter's stand-in), traced on fake CUDA tensors: AOT dispatch sees
    # the kernel itself, with the grid launch_config chose; what Inductor then makes of it needs a GPU
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", TRACE_TRITON_OP], env=env, cwd=os.path.dirname(__file__), capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "(8, 128) torch.bfloat16"


def test_a_compiled_model_takes_the_fused_path_inside_the_block_only():
    # as the removed bench/gpu_decode.py did: the model is compiled before the block, and again after
    model = tiny_lora_model()
    ran = []  # for each call, how many fused ops its compiled graph holds

    def backend(gm, inputs):
        fused = [str(n.target) for n in gm.graph.nodes].count("vlrl.nf4_matmul")
        compiled = torch._dynamo.lookup_backend("aot_eager")(gm, inputs)
        return lambda *args: ran.append(fused) or compiled(*args)

    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 128).to(torch.bfloat16).to(DEVICE)
    with torch.no_grad():
        expected = compiled(x)
        with nf4_decode.fused_decode(model):
            assert_bf16_close(compiled(x), expected)
        compiled(x)
    assert ran == [0, 2, 0]


def test_the_unused_kernel_lives_beside_its_test_not_in_the_package():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert (root / "tests" / "nf4_decode.py").is_file() and not (root / "bench" / "nf4_decode.py").exists()
    assert not [path for path in (root / "vlrl").rglob("*.py") if "nf4_decode" in path.read_text()]
    assert "nf4_decode" not in (root / "docs" / "design.md").read_text()  # not a module of the package
