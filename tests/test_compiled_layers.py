"""The decoder layers compiled for cache-free forwards (`vlrl.training.compiled_layers`), on the tiny Qwen3-VL with
LoRA and gradient checkpointing as GSPO trains it: the same log-probs and adapter gradients as the eager layers, a
cached forward (decoding) through the eager layer, and the switch undone. Compiled on the CPU here (Inductor's C++
backend); on a GPU the same code goes through Triton (bench/gpu_update.py --compiled both times it)."""

import copy
from dataclasses import replace

import pytest
import torch

from vlrl import engine, model
from vlrl.base import synthetic
from vlrl.engine import fusion, loop, weights
from vlrl.model import prompts
from vlrl.training import compiled_layers

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def policy(tiny_base_dir):
    torch.manual_seed(0)
    policy, _ = model.load_model(str(tiny_base_dir), lora=model.LoraSettings(r=8, alpha=16), backend="transformers")
    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.enable_input_require_grads()
    policy.train()
    for name, p in policy.named_parameters():  # LoRA's B starts at zero: give the adapters a gradient path both ways
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    yield policy
    compiled_layers.eager_decoder_layers(policy)


def logps_and_grads(policy, ids: torch.Tensor, completion: int = 16):
    policy.zero_grad(set_to_none=True)
    logits = policy(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=completion + 1).logits
    logps = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, -completion:, None]).squeeze(-1)
    (-logps.mean()).backward()
    return logps.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def test_compiled_layers_train_as_the_eager_ones(policy):
    assert compiled_layers.compile_decoder_layers(policy) == 0  # a CPU model: off unless asked
    shapes = [torch.randint(1000, 5000, (2, 40), generator=torch.Generator().manual_seed(1)),
              torch.randint(1000, 5000, (3, 56), generator=torch.Generator().manual_seed(2))]
    eager = [logps_and_grads(policy, ids) for ids in shapes]
    assert compiled_layers.compile_decoder_layers(policy, cuda_only=False) == 2  # the tiny model's two layers
    assert compiled_layers.compile_decoder_layers(policy, cuda_only=False) == 2  # idempotent
    torch._dynamo.utils.counters.clear()
    compiled = [logps_and_grads(policy, ids) for ids in shapes]  # two shapes (rows, width), one dynamic graph
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph for both layers and both shapes
    for (logps, grads), (c_logps, c_grads) in zip(eager, compiled):
        assert torch.allclose(logps, c_logps, atol=1e-5, rtol=1e-5)
        assert grads.keys() == c_grads.keys() and any("lora_A" in k for k in grads)
        for name in grads:
            assert torch.allclose(grads[name], c_grads[name], atol=1e-6, rtol=1e-4), name


def test_a_forward_with_a_cache_and_a_copy_run_the_eager_layers(policy):
    compiled_layers.compile_decoder_layers(policy, cuda_only=False)
    ids = torch.randint(1000, 5000, (1, 12), generator=torch.Generator().manual_seed(3))
    policy.eval()
    try:
        with torch.no_grad():
            torch._dynamo.utils.counters.clear()
            out = policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                                  do_sample=False)
            assert not torch._dynamo.utils.counters["stats"]["unique_graphs"]  # decoding never compiled the layers
            copied = copy.deepcopy(policy)
            layer = next(m for m in copied.modules() if type(m).__name__ == "Qwen3VLTextDecoderLayer")
            with torch.no_grad():
                layer.mlp.down_proj.base_layer.weight.mul_(0)  # the copy's own weights, not the original's, compute
            assert not torch.equal(copied(input_ids=ids).logits, policy(input_ids=ids).logits)
    finally:
        policy.train()
    assert out.shape == (1, 16)
    assert compiled_layers.eager_decoder_layers(policy) == 2
    layer = next(m for m in policy.modules() if type(m).__name__ == "Qwen3VLTextDecoderLayer")
    assert type(layer) not in compiled_layers._SUBCLASSES.values()


def test_a_packed_layer_under_compile_differentiates_the_dequantized_weight():
    qweight, scales = weights.quantize(torch.randn(64, 128) * 0.02)
    packed = weights.PackedLinear(qweight, scales, None)
    x = torch.randn(5, 128, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(5, 64, dtype=torch.bfloat16)
    packed(x).backward(grad)
    eager = x.grad.clone()
    x.grad = None
    torch.compile(lambda inputs: packed(inputs), dynamic=True)(x).backward(grad)
    assert torch.allclose(x.grad.float(), eager.float(), atol=1e-2, rtol=1e-2)
    assert torch.allclose(eager.float(), (grad.float() @ packed.dequantized().float()), atol=1e-2, rtol=1e-2)


def test_after_a_fused_decode_the_layers_still_share_one_graph(policy, tiny_processor, monkeypatch):
    """The engine's shared-input groups (`vlrl.engine.fusion`) give each grouped LoRA layer its own forward object
    while a decode runs; set on the layers for good, the compiled layer's graph guarded on that object and compiled
    once per decoder layer, up to dynamo's limit of 8 (the 8B's 36 layers: 8 compiles, then 28 eager; plan s55)."""
    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    item = prompts.to_prompt(synthetic.generate(1, seed=5, image_size=64)[0])
    text = tiny_processor.apply_chat_template(item["prompt"], add_generation_prompt=True, tokenize=False)
    policy.eval()
    try:
        decoding = replace(engine.decoding_for(policy, tiny_processor, max_new_tokens=3, static=True), stop_ids=())
        engine.complete(policy, tiny_processor, [text], [[item["image"]]], decoding)  # records the groups
    finally:
        policy.train()
    groups = fusion.groups(policy.get_base_model())
    assert groups and not any("forward" in vars(m) for g in groups for m in g.members)  # off outside a decode
    compiled_layers.compile_decoder_layers(policy, cuda_only=False)
    torch._dynamo.reset()  # nothing compiled before counts
    torch._dynamo.utils.counters.clear()
    logps_and_grads(policy, torch.randint(1000, 5000, (2, 48), generator=torch.Generator().manual_seed(4)))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # not one a layer
    compiled_layers.eager_decoder_layers(policy)


class Qwen3VLTextDecoderLayer(torch.nn.Module):  # a stand-in under the real layer's name, for the failure below
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, past_key_values=None):
        return self.proj(x) * 2


def test_a_compile_that_fails_leaves_the_layers_eager_with_a_warning(monkeypatch):
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no kernel for this here")

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=failing_backend, **kw))
    stack = torch.nn.Sequential(Qwen3VLTextDecoderLayer(), Qwen3VLTextDecoderLayer())
    x = torch.randn(3, 4)
    expected = stack(x)
    assert compiled_layers.compile_decoder_layers(stack, cuda_only=False) == 2
    with pytest.warns(UserWarning, match="compiling Qwen3VLTextDecoderLayer's training forward failed"):
        assert torch.equal(stack(x), expected)  # the first layer's failure: both run eager, the step goes on
    assert torch.equal(stack(x), expected)


def test_a_run_switches_its_layers_on_one_process_of_the_transformers_backend_only(policy, monkeypatch):
    switched = []
    monkeypatch.setattr(compiled_layers, "compile_decoder_layers", lambda model: switched.append(model) or 2)
    assert compiled_layers.for_run(policy, False) == 0 and not switched  # [training] compiled_layers = false
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert compiled_layers.for_run(policy, True) == 0 and not switched  # a launch of several processes
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert compiled_layers.for_run(policy, True) == 2 and switched == [policy]


@pytest.mark.slow
def test_a_gspo_step_with_compiled_layers_moves_the_adapter_as_the_eager_one(tiny_dir, tmp_path, monkeypatch):
    """The whole single-turn step (the engine's rollouts, rewards, merged passes scored through the chunked head,
    the optimizer) with the layers compiled, on the CPU: the adapter after one optimizer step is the eager run's."""
    import functools

    from vlrl.config import runfile as cfg
    from vlrl.training import train

    def one_step(name: str) -> dict:
        config = cfg.preset("tiny")
        for key, value in {"max_steps": 1, "save_steps": 1, "max_completion_length": 16, "pass_tokens": 4096,
                           "warmup_steps": 0}.items():  # no warm-up: the one step moves the adapter
            setattr(config.training, key, value)
        torch.manual_seed(0)
        policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
        rows = prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64))
        train.train(config, policy, processor, rows, tmp_path / name, log=lambda *_: None)
        switched = compiled_layers.switched_layers(policy)
        return switched, {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}

    switched, eager = one_step("eager")
    assert switched == 0  # on a CPU a run leaves its layers eager
    real = compiled_layers.compile_decoder_layers
    monkeypatch.setattr(compiled_layers, "compile_decoder_layers", functools.partial(real, cuda_only=False))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    switched, compiled = one_step("compiled")
    assert switched == 2 and torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the layers ran compiled
    moved = [n for n in eager if "lora_B" in n and torch.count_nonzero(eager[n])]
    assert moved, "the eager step left every lora_B at zero"
    for name in eager:
        assert torch.allclose(eager[name], compiled[name], rtol=1e-3, atol=1e-6), name


@pytest.mark.slow
def test_an_episode_micro_batch_in_passes_scores_through_the_compiled_layers_as_eager(tiny_base_dir, tmp_path):
    """An episode run's passes (a pass per turn: widths and pictures differ) through the compiled layers: the loss
    and the adapters' gradient of the eager layers."""
    from vlrl.config import runfile as cfg
    from vlrl.episodes.rollout import play
    from vlrl.training import episode_trainer, train

    base, processor = model.load_model(str(tiny_base_dir), backend="transformers")
    policy = model.add_lora(base, model.LoraSettings(r=8, alpha=16))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(2))
    config = cfg.preset("grid-tiny", overrides=["training.per_device_train_batch_size=4", "training.num_generations=4",
                                                "env.max_turns=2", "env.options={size=3, difficulty=1, max_turns=2}"])
    built = train.build_trainer(config, policy, processor, episode_trainer.seed_dataset([1_000_000]), tmp_path,
                                log=lambda *_: None)
    torch.manual_seed(1)
    rows = episode_trainer.turn_rows(play(policy, processor, built.make_env, [0, 0], built.play_settings), [1.0, -0.5])
    built.current_gradient_accumulation_steps, built.pass_tokens = 1, 1  # a pass a turn
    policy.train()
    params = [p for p in policy.parameters() if p.requires_grad]

    def loss_and_gradient():
        micro = built._micro_batches(rows)[0]
        assert len(micro["passes"]) > 1
        loss = built.compute_loss(policy, micro)
        loss.backward()
        gradient = torch.cat([p.grad.flatten() for p in params])
        for p in params:
            p.grad = None
        return loss.item(), gradient

    eager = loss_and_gradient()
    assert compiled_layers.compile_decoder_layers(policy, cuda_only=False) == 2
    try:
        compiled = loss_and_gradient()
    finally:
        compiled_layers.eager_decoder_layers(policy)
    assert compiled[0] == pytest.approx(eager[0], abs=1e-6)
    assert eager[1].norm() > 0 and (compiled[1] - eager[1]).norm() <= 1e-4 * eager[1].norm()
