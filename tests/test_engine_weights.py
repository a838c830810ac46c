"""The 8-bit repack of a 4-bit base (`vlrl.engine.weights`): the format's error bound against NF4, the packed layer
against the NF4-dequantized reference at several row counts, the tiny Qwen3-VL with bitsandbytes NF4 layers packed
under PEFT LoRA (logits within the stated tolerance, gradients to the adapters, the vision tower left alone), and the
errors. On CPU the plain-torch backend computes; on a GPU with gemlite, its kernel as well."""

import importlib.util

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes", reason="the repack reads bitsandbytes' 4-bit weights: pip install vlrl[gpu]")

from vlrl.engine import weights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch"] + (["gemlite"] if DEVICE == "cuda" and importlib.util.find_spec("gemlite") else [])


def linear4bit(k: int, n: int, *, bias: bool = False, seed: int = 0, weight: torch.Tensor | None = None):
    """A bitsandbytes NF4 layer (blocks of 64, double quantization, bf16 compute), as vlrl's 4-bit loads make them."""
    g = torch.Generator().manual_seed(seed)
    layer = bnb.nn.Linear4bit(k, n, bias=bias, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=True)
    w = weight if weight is not None else torch.randn(n, k, generator=g) * 0.02
    layer.weight = bnb.nn.Params4bit(w.to(torch.bfloat16), requires_grad=False, compress_statistics=True,
                                     quant_type="nf4")
    if bias:
        layer.bias = torch.nn.Parameter(torch.randn(n, generator=g).to(torch.bfloat16) * 0.1, requires_grad=False)
    layer.support_avx512bf16_for_cpu = False  # bitsandbytes would repack the weight for its CPU kernel
    return layer.to(DEVICE)


def relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.double() - reference).norm() / reference.norm())


# the format's promise: int8 holds every NF4 value within half a step of its group's grid (the group's absmax / 254;
# the scale rounded up to bf16 adds at most 2^-8 of that), fp8's 3 mantissa bits within 2^-4 of each value
# (relative, down to e4m3's smallest step, 2^-9 of the scale); bf16's rounding of the product q * s adds up to 2^-9
# of each weight. Groups: one per output channel (the default), and NF4's own blocks of 64
@pytest.mark.parametrize("group", [None, 64])
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_repacked_weights_stay_within_the_format_bound_of_nf4(fmt, group):
    layer = linear4bit(256, 96)
    packed = weights.PackedLinear.from_linear4bit(layer, fmt, group=group)
    groups = 256 // (group or 256)
    assert packed.qweight.dtype == weights.FORMATS[fmt] and packed.scales.shape == (groups, 96)
    reference = weights.nf4_weight(layer).float().reshape(96, groups, -1)
    error = (packed.dequantized().float().reshape(96, groups, -1) - reference).abs()
    absmax = reference.abs().amax(dim=-1, keepdim=True)
    if fmt == "int8":
        bound = absmax / 254 * (1 + 2**-7)
    else:
        bound = 2**-4 * reference.abs() + absmax / 448 * 2**-9 * 1.01
    assert (error <= bound + 2**-8 * reference.abs()).all()
    assert error.max() > 0  # a real repack, not the NF4 values passed through


def test_per_channel_rounding_is_unbiased_where_64_blocks_are_not():
    # the same 16 NF4 values sit on the same int8 points in every 64-block, so their errors keep a sign; per channel
    # the scale differs from the blocks' and the errors average out (the module docstring's reason for the default)
    layer = linear4bit(4096, 256)
    reference = weights.nf4_weight(layer).double()
    bias = {group: float((weights.PackedLinear.from_linear4bit(layer, group=group).dequantized().double()
                          - reference).mean() / reference.pow(2).mean().sqrt()) for group in (None, 64)}
    assert abs(bias[None]) < 1e-4 < abs(bias[64])


# rows: one sequence, decode batches (16, 32, a ragged 13), the kernel's limit (64) and past it (prefill, training)
@pytest.mark.parametrize("rows", [1, 13, 16, 32, 64, 65, 200])
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_layer_matches_the_nf4_reference(rows, backend):
    layer = linear4bit(192, 320, bias=True, seed=rows)
    packed = weights.PackedLinear.from_linear4bit(layer, "int8", backend=backend)
    x = torch.randn(rows, 192, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16).to(DEVICE)
    reference = x.double() @ weights.nf4_weight(layer).double().T + layer.bias.double()
    with torch.no_grad():
        y, nf4 = packed(x), layer(x)
    assert y.shape == (rows, 320) and y.dtype == torch.bfloat16
    # int8's weight error (~0.5% RMS) over the NF4 layer's own bf16 output rounding (~0.2%)
    assert relative_error(y, reference) < 1.5e-2
    assert relative_error(nf4, reference) < 5e-3
    # and against its own weights, only rounding: the kernel and the dequantized path compute the same function
    own = x.double() @ packed.dequantized().double().T + packed.bias.double()
    assert relative_error(y, own) < 5e-3


def test_leading_dimensions_and_a_float32_input():
    layer = linear4bit(128, 64, bias=True)
    packed = weights.PackedLinear.from_linear4bit(layer)
    x = torch.randn(2, 3, 128).to(DEVICE)
    with torch.no_grad():
        y = packed(x)
    assert y.shape == (2, 3, 64) and y.dtype == torch.float32
    assert relative_error(y, x.double() @ packed.dequantized().double().T + packed.bias.double()) < 1e-5


def test_without_kernels_routes_every_row_count_through_the_dequantized_weight(monkeypatch):
    """Where gemlite's kernel would take a short bf16 input (a probe's few dozen tokens), `without_kernels` sends it
    through the dequantized weight instead: what the adapter read-back check compares on (here the kernel is a
    recording stand-in; CPUs have no gemlite)."""
    layer = linear4bit(128, 64, bias=False)
    packed = weights.PackedLinear.from_linear4bit(layer)
    calls = []
    packed._kernel_args, packed._splitk = ((), {}), 0  # as `_build_kernel` leaves them where gemlite is installed
    monkeypatch.setattr(torch.ops, "gemlite", type("Ops", (), {"forward_functional": staticmethod(
        lambda x, *_: calls.append(x.shape) or torch.zeros(*x.shape[:-1], 64, dtype=x.dtype))})(), raising=False)
    x = torch.randn(5, 128).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        through_kernel = packed(x)
        with weights.without_kernels():
            exact = packed(x)
        again = packed(x)
    assert calls == [(5, 128), (5, 128)] and not through_kernel.any() and not again.any()  # the kernel's, twice
    reference = torch.nn.functional.linear(x, packed.dequantized(torch.bfloat16))
    assert torch.equal(exact, reference) and weights.KERNELS


def test_input_gradient_without_keeping_a_weight_copy():
    layer = linear4bit(128, 64)
    packed = weights.PackedLinear.from_linear4bit(layer)
    x = torch.randn(5, 128, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    grad = torch.randn(5, 64, dtype=torch.bfloat16, device=DEVICE)
    packed(x).backward(grad)
    assert relative_error(x.grad, grad.double() @ packed.dequantized().double()) < 5e-3
    assert not any(t.requires_grad for t in packed.buffers())


def test_a_dtype_cast_of_the_model_keeps_the_format():
    packed = weights.PackedLinear.from_linear4bit(linear4bit(128, 64), "fp8")
    before = packed.dequantized()
    packed.to(torch.float32)
    assert packed.qweight.dtype == torch.float8_e4m3fn and packed.scales.dtype == torch.bfloat16
    assert torch.equal(packed.dequantized(), before)


def quantize_linears(model) -> None:
    """Every Linear of the tiny Qwen3-VL but the lm_head, vision tower included, as a bitsandbytes NF4 layer: what a
    4-bit load does on a GPU, done by hand on the CPU (transformers' 4-bit loading wants CUDA)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and name != "lm_head":
                layer = linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                   weight=child.weight.detach().float())
                if child.bias is not None:
                    layer.bias = torch.nn.Parameter(child.bias.detach().to(torch.bfloat16), requires_grad=False)
                setattr(parent, name, layer)


@pytest.fixture
def tiny_4bit_lora(tiny_base_dir):
    """The tiny Qwen3-VL with NF4 layers (language model and vision tower), under vlrl's LoRA with nonzero adapters."""
    from transformers import AutoModelForImageTextToText

    from vlrl.model.loading import LoraSettings, add_lora

    model = AutoModelForImageTextToText.from_pretrained(tiny_base_dir, dtype=torch.bfloat16)
    quantize_linears(model)
    policy = add_lora(model.to(DEVICE), LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator(device=p.device).manual_seed(1))
    return policy


def text_inputs(processor, device=DEVICE) -> dict:
    texts = ["What is 2 + 3? Answer with a number.", "Name the largest value in the chart, then explain why."]
    return processor(text=texts, return_tensors="pt", padding=True).to(device)


def test_packed_tiny_model_logits_within_tolerance_and_the_vision_tower_untouched(tiny_4bit_lora, tiny_processor):
    policy = tiny_4bit_lora
    vision = {n: (m, m.weight.data.clone()) for n, m in weights.packable_layers(policy, vision=True)}
    language = weights.packable_layers(policy)
    assert vision and len(language) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    assert all(n.endswith(".base_layer") for n, _ in language)  # PEFT's LoRA wraps every one of them
    inputs = text_inputs(tiny_processor)
    reference = weights.reference_logits(policy, inputs)

    report = weights.pack_for_decoding(policy, "int8", backend=BACKENDS[-1])
    assert report["layers"] == 14 and report["format"] == "int8" and report["vision_layers_left"] == len(vision)
    assert report["bytes_before"] < report["bytes_after"] < 2.2 * report["bytes_before"]  # 0.52 -> 1 B/param
    assert 0 < report["weight_error"] < 2e-2  # int8 per channel: ~8e-3 of the weights' RMS
    assert sum(isinstance(m, weights.PackedLinear) for m in policy.modules()) == 14
    assert weights.packable_layers(policy) == []
    for name, module in policy.named_modules():  # LoRA's own weights are still PEFT's, and still train
        if name.endswith(("lora_A.default", "lora_B.default")):
            assert type(module) is torch.nn.Linear and module.weight.requires_grad

    check = weights.verify_packing(policy, inputs, reference)
    assert check["relative_error"] < 2e-2 and check["mean_kl"] < 1e-5  # measured 1.2e-2 and 2e-6
    after = dict(weights.packable_layers(policy, vision=True))
    for name, (module, data) in vision.items():
        assert after[name] is module and torch.equal(module.weight.data, data)


def test_verify_packing_fails_on_a_wrong_repack(tiny_4bit_lora, tiny_processor):
    inputs = text_inputs(tiny_processor)
    reference = weights.reference_logits(tiny_4bit_lora, inputs)
    weights.pack_for_decoding(tiny_4bit_lora, "int8")
    packed = tiny_4bit_lora.get_submodule("base_model.model.model.language_model.layers.0.mlp.down_proj.base_layer")
    packed.qweight.copy_(packed.qweight.flip(0))  # a layout error: the output channels in the wrong order
    with pytest.raises(ValueError, match="repack is wrong"):
        weights.verify_packing(tiny_4bit_lora, inputs, reference)


def test_gradients_reach_the_adapters_through_packed_layers(tiny_4bit_lora, tiny_processor):
    policy = tiny_4bit_lora
    inputs = text_inputs(tiny_processor)

    def adapter_grads() -> dict:
        policy.zero_grad(set_to_none=True)
        logits = policy(**inputs).logits.float()
        logits.log_softmax(-1)[..., :100].mean().backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    nf4 = adapter_grads()
    weights.pack_for_decoding(policy, "int8")
    packed = adapter_grads()
    assert packed.keys() == nf4.keys() and len(packed) == 2 * 14  # lora_A and lora_B of every packed layer
    for name, grad in packed.items():
        assert grad.abs().sum() > 0, name
        assert relative_error(grad, nf4[name].double()) < 0.1, name  # the same gradients, up to the repack
    assert not any(t.requires_grad for m in policy.modules() if isinstance(m, weights.PackedLinear)
                   for t in m.buffers())


def test_nothing_to_pack_unknown_format_and_backend():
    plain = torch.nn.Sequential(torch.nn.Linear(64, 64))
    with pytest.raises(ValueError, match="no bitsandbytes 4-bit layer"):
        weights.pack_for_decoding(plain)
    model = torch.nn.Sequential(linear4bit(64, 64))
    with pytest.raises(ValueError, match="unknown packed format 'int4'"):
        weights.pack_for_decoding(model, "int4")
    with pytest.raises(ValueError, match="unknown packing backend"):
        weights.pack_for_decoding(model, backend="marlin")
    with pytest.raises(ValueError, match="groups of 48"):
        weights.quantize(torch.randn(8, 64), "int8", group=48)
    assert isinstance(model[0], bnb.nn.Linear4bit)  # a refused call packs nothing


@pytest.mark.skipif(DEVICE == "cuda", reason="what a machine without a GPU gets")
def test_choose_format_on_cpu():
    assert weights.choose_format("cpu") == {"format": "int8", "backend": "torch",
                                            "reason": "no GPU: dequantize + F.linear, the same weights the GPU "
                                                      "kernel reads"}
    with pytest.raises(ValueError, match="CUDA GPUs only"):
        weights.choose_format("cpu", backend="gemlite")


def test_decoding_steps_compute_each_shared_input_once_over_one_packed_buffer(tiny_4bit_lora, tiny_processor,
                                                                             monkeypatch):
    """On the static path, q/k/v and gate/up (the LoRA layers fed one input) decode as one base matmul and one LoRA
    pair (`vlrl.engine.fusion`): the same tokens and log-probs as layer by layer, over the same bytes (each packed
    layer's buffers are views of its group's), and every forward outside a decode computes as before."""
    from vlrl import engine
    from vlrl.engine import fusion, loop

    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    policy = tiny_4bit_lora
    weights.pack_for_decoding(policy, "int8")
    packed_bytes = sum(weights._bytes(m) for m in policy.modules() if isinstance(m, weights.PackedLinear))
    inputs = text_inputs(tiny_processor)
    before = weights.reference_logits(policy, inputs)
    texts = ["What is 2 + 3? Answer with a number.", "Name the largest value in the chart, then explain why."]
    decoding = engine.decoding_for(policy, tiny_processor, max_new_tokens=12, static=True, temperature=1.0,
                                   record_logps=True)

    def run(enabled: bool):
        monkeypatch.setattr(fusion, "ENABLED", enabled)
        torch.manual_seed(0)
        return engine.complete(policy, tiny_processor, texts, [[], []], decoding)

    layer_by_layer = run(False)
    computed = []
    compute = fusion.Group.compute
    monkeypatch.setattr(fusion.Group, "compute", lambda self, x: computed.append(self) or compute(self, x))
    grouped = run(True)
    groups = fusion.groups(policy.get_base_model())
    assert [[m.base_layer.out_features for m in g.members] for g in groups] == [[64, 32, 32], [128, 128]] * 2
    assert [c.ids for c in grouped] == [c.ids for c in layer_by_layer]
    steps = max(len(c.ids) for c in grouped) - 1  # forwards after the prefill
    assert computed == groups * steps and steps > 0
    for a, b in zip(grouped, layer_by_layer):
        assert torch.allclose(torch.tensor(a.logps), torch.tensor(b.logps), atol=1e-4)
    for group in groups:
        start = group.base.qweight.data_ptr()
        for member in group.members:
            assert member.base_layer.qweight.data_ptr() == start  # a view of the group's buffer
            start += member.base_layer.qweight.numel()
    assert sum(weights._bytes(m) for m in policy.modules()
               if isinstance(m, weights.PackedLinear)) == packed_bytes  # views: nothing added
    assert not any(g.active for g in groups)
    assert torch.equal(weights.reference_logits(policy, inputs), before)
