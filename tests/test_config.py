"""The GSPO recipe as a GRPOConfig, run files and their validation, and the shipped presets."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from vlrl.cli import main
from vlrl.config import recipe as gspo
from vlrl.config import runfile as cfg
from vlrl.grammar.rewards import REWARD_WEIGHTS

ROOT = Path(__file__).resolve().parent.parent


def test_gspo_config_reproduces_the_recipe(tmp_path):
    args = gspo.gspo_config(str(tmp_path))
    assert args.learning_rate == 5e-6
    assert args.lr_scheduler_type.value == "cosine"
    assert args.optim.value == "adamw_torch"  # no CUDA / bitsandbytes here; adamw_8bit on a GPU
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.num_generations) == (8, 4, 4)
    assert args.generation_batch_size == 32  # 8 prompts x 4 completions per optimizer step
    assert (args.max_completion_length, args.num_train_epochs, args.max_grad_norm) == (1024, 1, 0.1)
    assert (args.importance_sampling_level, args.loss_type, args.scale_rewards) == ("sequence", "dr_grpo", "none")
    assert args.mask_truncated_completions is False and args.beta == 0.0
    assert args.reward_weights == list(REWARD_WEIGHTS)
    assert args.vllm_importance_sampling_correction is False


def test_gspo_config_overrides_win(tmp_path):
    args = gspo.gspo_config(str(tmp_path), learning_rate=1e-5, num_generations=8, loss_type="grpo")
    assert (args.learning_rate, args.num_generations, args.loss_type) == (1e-5, 8, "grpo")


def test_gspo_paper_recipe_is_trls_documented_gspo_with_the_same_rollout(tmp_path):
    paper = gspo.gspo_config(str(tmp_path), recipe="gspo-paper")
    assert (paper.loss_type, paper.importance_sampling_level, paper.scale_rewards) == ("grpo", "sequence", "group")
    assert (paper.epsilon, paper.epsilon_high, paper.beta) == (3e-4, 4e-4, 0.0)
    # each rollout of 32 completions becomes 4 optimizer steps of 8 (TRL: accumulation 1, steps_per_generation 4)
    assert (paper.gradient_accumulation_steps, paper.steps_per_generation, paper.generation_batch_size) == (1, 4, 32)


def _trl_default(field, trl_config):
    value = getattr(trl_config, field)
    return getattr(value, "value", value)  # enums (optim) compare by their string


@pytest.mark.parametrize("field", sorted(gspo.BACKEND_DEFAULTS))
def test_every_default_trl_and_unsloth_disagree_on_is_set_explicitly(field, tmp_path):
    from trl import GRPOConfig

    trl_default, _ = gspo.BACKEND_DEFAULTS[field]  # the Unsloth column: bench/unsloth_defaults.py, on a GPU
    # the TRL column is what the installed TRL really defaults to
    assert _trl_default(field, GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)) == trl_default
    for recipe in gspo.RECIPES:
        assert field in gspo.gspo_values(recipe), f"gspo_values({recipe!r}) leaves {field} to the backend's default"


def test_the_run_files_training_defaults_are_the_recipes():
    """[training]'s defaults and the recipe's values are defined once (`recipe.TRAINING_DEFAULTS`): a run file that
    leaves a setting out runs the recipe's value, and the two cannot drift apart."""
    import dataclasses

    from vlrl.config.sections import TrainingConfig

    fields = {f.name: f.default for f in dataclasses.fields(TrainingConfig)}
    values = gspo.gspo_values()
    for key, default in gspo.TRAINING_DEFAULTS.items():
        assert fields[key] == default == values[key], key
    assert set(gspo.TRAINING_DEFAULTS) == {k for k in fields if k in values} - {"optim", "weight_decay", "warmup_steps"}


def test_recipe_values_are_what_the_trainer_receives(tmp_path):
    from vlrl.training.train import grpo_args

    tiny = cfg.preset("tiny")
    args = grpo_args(tiny, tmp_path)
    t = tiny.training
    assert (args.learning_rate, args.max_completion_length, args.max_steps) == (t.learning_rate,
                                                                                 t.max_completion_length, t.max_steps)
    assert (args.save_steps, args.seed, args.output_dir) == (t.save_steps, t.seed, str(tmp_path / "checkpoints"))
    assert args.save_only_model is False  # checkpoints keep the optimizer and RNG state for --resume
    assert grpo_args(cfg.preset("tiny", overrides=["training.optim=sgd"]), tmp_path).optim == "sgd"


def test_warmup_steps_reach_the_trainer(tmp_path):
    """The recipe's warm-up is 10% of the steps, rounded up: step 1 of grid-tiny's 8 runs at learning rate 0;
    [training] warmup_steps = 0 trains from the first step, and a whole number is a count of steps."""
    from vlrl.training.train import grpo_args

    assert grpo_args(cfg.preset("grid-tiny"), tmp_path).get_warmup_steps(8) == 1
    assert grpo_args(cfg.preset("grid-tiny", overrides=["training.warmup_steps=0"]), tmp_path).get_warmup_steps(8) == 0
    assert grpo_args(cfg.preset("tiny", overrides=["training.warmup_steps=3"]), tmp_path).get_warmup_steps(8) == 3
    for bad in ("2.5", "-0.5"):
        with pytest.raises(cfg.ConfigError, match=f"warmup_steps = {bad} must be a share of the steps"):
            cfg.preset("tiny", overrides=[f"training.warmup_steps={bad}"])


def test_trackers_are_the_integrations_transformers_reports_to():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(cfg.TRACKERS) == {"none", "all", *INTEGRATION_TO_CALLBACK}


@pytest.mark.parametrize("report_to,expected", [("none", []), ("tensorboard", ["tensorboard"]),
                                                (["tensorboard", "trackio"], ["tensorboard", "trackio"]),
                                                ("wandb", ["wandb"])])  # wandb is not installed: the run says so
def test_report_to_passes_through_to_the_trainer(report_to, expected, tmp_path):
    from vlrl.training.train import grpo_args

    (tmp_path / "run.toml").write_text(f"[training]\nreport_to = {json.dumps(report_to)}\n")
    config = cfg.load(tmp_path / "run.toml")  # validation names trackers only; it needs none installed
    args = grpo_args(config, tmp_path / "my-run")
    assert (args.report_to, args.project, args.run_name) == (expected, "vlrl", "my-run")
    assert args.trackio_static_space_id is False  # trackio never publishes a Space
    (tmp_path / "resolved.toml").write_text(cfg.to_toml(config))  # what config.toml in the run directory holds
    assert cfg.load(tmp_path / "resolved.toml") == config


# Each bad run file, and the words its error must contain: the key, the value, and the fix.
BAD_FILES = [
    # unknown names, with a suggestion
    ("[training]\nnum_generation = 4", ["num_generation", "Did you mean 'num_generations'"]),
    ("[traning]\nseed = 1", ["[traning]", "Did you mean 'training'"]),
    ("[model]\nbackend = \"unslot\"", ["backend", "'unslot'", "Did you mean 'unsloth'"]),
    ("[training]\nrecipe = \"gspo_paper\"", ["recipe", "'gspo_paper'", "gspo-paper"]),
    ("[export]\nformats = [\"lora\", \"onnx\"]", ["formats", "onnx", "merged16"]),
    ("[training]\nreport_to = \"tensorbord\"", ["report_to", "'tensorbord'", "Did you mean 'tensorboard'"]),
    # wrong types
    ("[model]\nlora_r = \"16\"", ["lora_r", "'16'", "integer", "lora_r = 16"]),
    ("[model]\nload_in_4bit = 1", ["load_in_4bit", "true or false", "load_in_4bit = false"]),
    ("[training]\nlearning_rate = \"5e-6\"", ["learning_rate", "a number"]),
    ("[export]\nformats = \"lora\"", ["formats", "list of strings", "[\"lora\"]"]),
    ("model = 3", ["model = 3", "section [model]"]),
    ("[training]\nreport_to = 1", ["report_to = 1", "tracker name or a list", '"tensorboard"']),
    # out of range
    ("[training]\nlearning_rate = 2.0", ["learning_rate = 2.0", "(0, 1)", "5e-6"]),
    ("[training]\ntemperature = 0.0", ["temperature = 0.0", "(0, 10)"]),
    ("[training]\nmax_steps = 0", ["max_steps = 0", "-1"]),
    ("[training]\nstop_on_degeneration = 1.5", ["stop_on_degeneration = 1.5", "0.5"]),
    ("[training]\nper_device_train_batch_size = 0", ["per_device_train_batch_size = 0", "above 0"]),
    ("[training]\nnum_generations = 1\nper_device_train_batch_size = 1\ngradient_accumulation_steps = 1",
     ["num_generations = 1", "at least 2"]),
    ("[model]\nlora_dropout = 1.0", ["lora_dropout = 1.0", "[0, 1)"]),
    ("[data]\nimage_size = 16", ["image_size = 16", "32"]),
    ("[data]\ndifficulty = 4", ["difficulty = 4", "1, 2 or 3"]),
    ("name = \"my run/1\"", ["name = 'my run/1'", "letters, digits"]),
    # inconsistent combinations
    ("[training]\nnum_generations = 3", ["per_device_train_batch_size 8", "gradient_accumulation_steps 4 = 32",
                                         "num_generations = 3", "divisor of 32 (e.g. 4)"]),
    ("[data]\nnum_items = 50\nhold_out = 50", ["hold_out = 50", "num_items = 50", "lower hold_out"]),
    ("[model]\nmax_seq_length = 1500", ["max_seq_length = 1500", "max_completion_length (1024)",
                                        "at least 2048"]),
    ("[eval]\nmax_new_tokens = 4096\n[model]\nmax_seq_length = 4096", ["max_new_tokens (4096)", "at least 5120"]),
    ("[model]\nname_or_path = \"Qwen/Qwen3-VL-8B-Instruct\"\nwarm_start_steps = 100",
     ["name_or_path = 'Qwen/Qwen3-VL-8B-Instruct' is not a model vlrl builds (tiny, tiny-small, tiny-qwen3.5",
      "warm_start_steps = 100 only applies to those", "vlrl sft"]),
    ("[model]\nname_or_path = \"tinyy\"\nwarm_start_steps = 100", ["name_or_path = 'tinyy' is not a model vlrl builds",
                                                                  "Did you mean 'tiny'?"]),
    ("[training]\ngeneration_batch_size = 12", ["generation_batch_size = 12", "multiple of per_device_train_batch_size", "e.g. 8"]),
    ("[training]\nrecipe = \"gspo-paper\"\ngeneration_batch_size = 8", ["gspo-paper", "remove one"]),
    ("[training]\nnum_train_epochs = 0.0", ["num_train_epochs = 0.0", "positive max_steps"]),
    # the rollout/training mismatch correction: both problems of one section in one pass
    ("[training]\nimportance_sampling_correction = \"tokens\"\nimportance_sampling_cap = 0.5",
     ["importance_sampling_correction = 'tokens'", "Did you mean 'token'", "importance_sampling_cap = 0.5",
      "at least 1"]),
    ("[model]\nbackend = \"unsloth\"\n[training]\nimportance_sampling_correction = \"token\"",
     ["importance_sampling_correction = 'token'", "transformers backend", 'backend = "auto"']),
    ("[env]\nname = \"grid\"\n[training]\nimportance_sampling_correction = \"sequence\"",
     ["importance_sampling_correction = 'sequence'", "not offered for episode runs", "until it is measured",
      "sampling/rollout_train_kl", '"off"']),
    ("[training]\nreport_to = [\"none\", \"trackio\"]", ["report_to = ['none', 'trackio']", "mixes",
                                                    'report_to = "none"']),
]


@pytest.mark.parametrize("text,words", BAD_FILES, ids=[b[0].splitlines()[-1] for b in BAD_FILES])
def test_bad_run_file_is_rejected_naming_key_value_and_fix(text, words, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(text + "\n")
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(path)
    for word in words:
        assert word in str(err.value), f"{word!r} missing from: {err.value}"


def test_validate_command_exits_nonzero_on_a_bad_file_and_zero_on_a_good_one(tmp_path, capsys):
    bad, good = tmp_path / "bad.toml", tmp_path / "good.toml"
    bad.write_text("[training]\nnum_generations = 3\n")
    good.write_text(cfg.to_toml(cfg.preset("tiny")))
    assert main(["validate", str(bad)]) == 1
    assert "num_generations = 3" in capsys.readouterr().err
    assert main(["validate", str(good)]) == 0
    assert main(["validate", str(tmp_path / "missing.toml")]) == 1
    (tmp_path / "broken.toml").write_text("[training\n")
    assert main(["validate", str(tmp_path / "broken.toml")]) == 1
    assert "not valid TOML" in capsys.readouterr().err


def test_presets_ship_the_tiny_gpu_and_qwen3_vl_sizes():
    assert {"tiny", "tiny-gpu", "qwen3-vl-8b-mathvista", "qwen3-vl-4b-mathvista",
            "qwen3-vl-2b-mathvista"} <= set(cfg.presets())


@pytest.mark.parametrize("name", cfg.presets())
def test_preset_round_trips_through_its_toml(name, tmp_path):
    preset = cfg.preset(name)
    (tmp_path / "run.toml").write_text(cfg.to_toml(preset))
    assert cfg.load(tmp_path / "run.toml") == preset


@pytest.mark.parametrize("name", cfg.presets())
def test_a_preset_states_only_what_it_changes(name):
    """The recipe's values are defined once (`recipe.TRAINING_DEFAULTS`, read by the [training] section's defaults): a
    preset that restated one would keep its copy when the recipe moved. `recipe` itself is the preset's choice."""
    from vlrl.config.sections import TrainingConfig

    text = (ROOT / "vlrl" / "presets" / f"{name}.toml").read_text()
    defaults = TrainingConfig()
    assert defaults.learning_rate == gspo.TRAINING_DEFAULTS["learning_rate"]  # the section reads the recipe's
    restated = {key: value for key, value in tomllib.loads(text).get("training", {}).items()
                if key != "recipe" and getattr(defaults, key) == value}
    assert not restated, f"{name} sets [training] keys to the recipe's own values: {restated}"


def test_presets_validate_offline_without_loading_torch_or_a_model():
    code = ("import sys; from vlrl import config; [config.preset(p) for p in config.presets()]; "
            "heavy = {'torch', 'transformers', 'trl', 'unsloth'} & set(sys.modules); assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("size", ["8b", "4b", "2b"])
def test_qwen3_vl_presets_carry_the_recipe(size):
    preset = cfg.preset(f"qwen3-vl-{size}-mathvista")
    m, d, t = preset.model, preset.data, preset.training
    four_bit = size == "8b"  # 2B and 4B fit 24 GB in bf16, which decodes faster (bench/results/gpu.md)
    assert m.name_or_path == (f"unsloth/Qwen3-VL-{size.upper()}-Instruct-unsloth-bnb-4bit" if four_bit
                              else f"Qwen/Qwen3-VL-{size.upper()}-Instruct")
    assert (m.load_in_4bit, m.max_seq_length, m.lora_r, m.lora_alpha) == (four_bit, 16384, 16, 16)
    assert (m.finetune_vision_layers, m.train_projector, m.backend) == (False, False, "auto")
    assert d.max_prompt_tokens == 1024 and d.source == "TIGER-Lab/ViRL39K"  # never a test set (tests/test_eval_source)
    recipe = gspo.gspo_values()
    for key in ("learning_rate", "num_generations", "max_completion_length", "num_train_epochs", "temperature"):
        assert getattr(t, key) == recipe[key], key
    assert t.recipe == "gspo"
    # The recipe's 32 completions per optimizer step, split for 24 GB: forwards of 4, rollouts decoded 8 at a time,
    # 16 for the 8B (its whole step at 16 measured 14.65 GiB reserved, bench/results/rehearsal.md)
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps == (
        recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"])
    assert (t.per_device_train_batch_size, t.generation_batch_size) == (4, 16 if size == "8b" else 8)


def test_generation_batch_size_decodes_each_micro_batch_just_in_time(tmp_path):
    from vlrl.training.train import grpo_args

    args = grpo_args(cfg.preset("qwen3-vl-8b-mathvista"), tmp_path)
    assert (args.generation_batch_size, args.steps_per_generation, args.gradient_accumulation_steps) == (16, 4, 8)
    args = grpo_args(cfg.preset("tiny"), tmp_path)  # 0: TRL's default, the whole step's rollouts in one call
    t = cfg.preset("tiny").training
    assert args.steps_per_generation == t.gradient_accumulation_steps


def test_generation_batch_size_counts_each_process(tmp_path, monkeypatch):
    """Per process: under 2 processes TRL is given twice the preset's 16, so each GPU still decodes 16 at once
    (measured on 2 H200s: halving it per GPU would waste the second GPU on a per-step-bound decode)."""
    from vlrl.base import distributed
    from vlrl.training.train import grpo_args

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    args = grpo_args(cfg.preset("qwen3-vl-8b-mathvista"), tmp_path)
    assert args.generation_batch_size == 32


def test_tiny_gpu_preset_is_the_tiny_preset_on_unsloth():
    tiny, gpu = cfg.preset("tiny").to_dict(), cfg.preset("tiny-gpu").to_dict()
    assert gpu["model"].pop("backend") == "unsloth" and tiny["model"].pop("backend") == "auto"
    assert (gpu.pop("name"), tiny.pop("name")) == ("tiny-gpu", "tiny")
    assert gpu == tiny


def test_every_problem_is_reported_in_one_pass(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text("[training]\nnum_generation = 4\nlearning_rate = 2.0\ntemperature = 0.0\n"
                    "[model]\nlora_r = \"16\"\n[data]\ndifficulty = 4\n")
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(path)
    assert len(err.value.problems) == 5, err.value.problems
    for word in ("num_generation", "learning_rate = 2.0", "temperature = 0.0", "lora_r = '16'", "difficulty = 4"):
        assert word in str(err.value)
    assert main(["validate", str(path)]) == 1
    printed = capsys.readouterr().err
    assert "5 problems" in printed and all(w in printed for w in ("num_generation", "difficulty = 4"))


def test_validate_takes_a_preset_name_and_overrides(tmp_path, capsys):
    # a GPU preset validates on this CPU; its hub model is pointed at a local directory (the hub is not reachable
    # from the tests, which validate refuses: tests/test_new_user.py)
    assert main(["validate", "qwen3-vl-8b-mathvista", "--set", f"model.name_or_path={tmp_path}"]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["validate", "tiny", "--set", "training.num_generations=3"]) == 1
    assert "num_generations = 3" in capsys.readouterr().err
    assert main(["validate", "tiny-gpuu"]) == 1
    assert "Did you mean 'tiny-gpu'" in capsys.readouterr().err


def test_set_overrides_land_in_the_config():
    config = cfg.preset("tiny", overrides=["training.max_steps=3", "training.learning_rate=1e-4", "name=quick",
                                           "data.tasks=['count', 'bar_value']", 'export.formats=["lora", "gguf"]',
                                           "model.name_or_path=tiny-small"])  # a bare word is a string
    assert (config.training.max_steps, config.training.learning_rate, config.name) == (3, 1e-4, "quick")
    assert (config.data.tasks, config.export.formats) == (["count", "bar_value"], ["lora", "gguf"])
    assert config.model.name_or_path == "tiny-small"


@pytest.mark.parametrize("override,words", [
    ("training.max_step=3", ["max_step", "Did you mean 'max_steps'"]),
    ("training.max_steps=three", ["max_steps = 'three'", "an integer"]),
    ("traning.seed=1", ["[traning]", "Did you mean 'training'"]),
    ("training.max_steps", ["section.key=value"]),
])
def test_set_overrides_are_validated_like_the_file(override, words, capsys):
    with pytest.raises(cfg.ConfigError) as err:
        cfg.preset("tiny", overrides=[override])
    assert all(word in str(err.value) for word in words), str(err.value)
    assert main(["run", "--preset", "tiny", "--set", override]) == 1  # refused before anything loads
    printed = capsys.readouterr().err
    assert all(word in printed for word in words), printed


def test_batch_rule_counts_the_processes():
    config = cfg.preset("tiny")  # 8 per device x 1 accumulation, 4 generations
    config.training.num_generations = 16
    with pytest.raises(cfg.ConfigError, match=r"x 1 process x gradient_accumulation_steps 1 = 8\) must be a multiple"):
        cfg.validate(config, num_processes=1)
    cfg.validate(config, num_processes=2)  # 8 x 2 processes = 16: whole groups again
    config.training.num_generations, config.training.generation_batch_size = 4, 8
    cfg.validate(config, num_processes=1)
    cfg.validate(config, num_processes=3)  # per process: each decodes 8 at once, 24 in all
    config.training.generation_batch_size = 12
    with pytest.raises(cfg.ConfigError, match=r"= 12 \(completions each process .* x 3 processes = 36 in all\).*e.g. 8"):
        cfg.validate(config, num_processes=3)


def test_reward_set_is_chosen_in_the_run_file(tmp_path):
    from vlrl.grammar import rewards

    config = cfg.preset("tiny", overrides=["training.reward=\"symbolic\""])
    assert config.training.reward == "symbolic"
    with pytest.raises(cfg.ConfigError, match="reward = 'symbolc'.*Did you mean 'symbolic'"):
        cfg.preset("tiny", overrides=["training.reward=symbolc"])
    assert [f.__name__ for f in rewards.reward_funcs(symbolic=True)][1] == "symbolic_correctness_reward"


def test_optimizer_and_lora_targets_are_checked_and_sgd_widens_the_learning_rate():
    config = cfg.preset("tiny", overrides=["model.lora_targets=head", "training.optim=sgd",
                                           "training.learning_rate=5", "training.weight_decay=0"])
    cfg.validate(config, num_processes=1)  # SGD's step is lr x the clipped gradient: lr above 1 is fine
    with pytest.raises(cfg.ConfigError) as err:
        cfg.preset("tiny", overrides=["model.lora_targets=heads", "training.optim=sgdd", "training.learning_rate=5"])
    for word in ("lora_targets = 'heads'", "optim = 'sgdd'", "learning_rate = 5.0 must be in (0, 1)"):
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("machine,optim,reason_words,precision", [
    ({"cuda": True, "bf16": True, "bitsandbytes": True, "sharded": False}, "adamw_8bit", "8-bit AdamW states", "bf16"),
    ({"cuda": True, "bf16": True, "bitsandbytes": False, "sharded": False}, "adamw_torch",
     "bitsandbytes is not installed", "bf16"),
    ({"cuda": True, "bf16": True, "bitsandbytes": True, "sharded": True}, "adamw_torch", "FSDP / ZeRO-3", "bf16"),
    ({"cuda": True, "bf16": False, "bitsandbytes": True, "sharded": False}, "adamw_8bit", "8-bit AdamW states", "fp32"),
    ({"cuda": False}, "adamw_torch", "no CUDA GPU", "fp32"),
])
def test_the_recipe_names_its_optimizer_and_precision_with_the_reason(machine, optim, reason_words, precision):
    """Issue 47, point 9: the 8-bit AdamW and bf16 were picked from the machine without a word."""
    from vlrl.config.recipe import machine_choices, machine_line

    chosen = machine_choices(**machine)
    assert (chosen["optim"], chosen["precision"]) == (optim, precision)
    assert reason_words in chosen["optim_reason"] and chosen["precision_reason"]
    line = machine_line(chosen)
    assert f"optimizer {optim} (" in line and f"precision {precision} (" in line
    assert machine_choices("sgd", **machine)["optim_reason"] == "[training] optim"  # the run file's choice, named


@pytest.mark.parametrize("name", ["qwen3-vl-2b-crafter", "qwen3-vl-8b-crafter"])
def test_the_crafter_presets_say_what_a_step_holds(name, tmp_path):
    """Their comment said "episodes per micro-batch"; the episode trainer cuts its forward passes by tokens, and a
    step plays per_device_train_batch_size x gradient_accumulation_steps episodes per process (TRL's generation
    batch: the recipe's steps_per_generation is the accumulation), num_generations of each seed."""
    from vlrl.training import train

    path = ROOT / "vlrl" / "presets" / f"{name}.toml"
    text = path.read_text()
    t = cfg.preset(name).training  # the recipe's values where the preset leaves them
    assert "micro-batch" not in text
    claimed = re.search(r"(\d+) x (\d+) = (\d+) episodes per optimizer step = (\d+) seeds x (\d+) episodes", text)
    assert claimed, "the accumulation comment states the step's episodes"
    per_device, accumulation, episodes, seeds, group = map(int, claimed.groups())
    assert (per_device, accumulation, group) == (t.per_device_train_batch_size, t.gradient_accumulation_steps,
                                                 t.num_generations)
    args = train.grpo_args(cfg.preset(name), tmp_path)
    assert args.per_device_train_batch_size * args.steps_per_generation == episodes == seeds * group


@pytest.mark.parametrize("installed,refused", [("1.14.2", False), ("1.16.0", True), ("", False)])
def test_a_lora_on_the_output_layer_is_refused_where_trl_refuses_it(installed, refused, monkeypatch):
    """TRL 1.16 raises at trainer creation on a PEFT adapter over lm_head (after the baseline eval); vlrl says so in
    one line before anything loads: `vlrl validate` and the stage that loads the policy (grid-tiny trains LoRA on
    the head). The preset itself stays readable on any TRL."""
    from vlrl import run
    from vlrl.base.errors import ConfigError
    from vlrl.config import validation
    from vlrl.config.preflight import preflight

    monkeypatch.setattr(validation, "_trl_version", lambda: installed)
    grid = cfg.preset("grid-tiny")
    said = [p for p in preflight(grid)[1] if "lora_targets = 'head'" in p and "refuses" in p]
    assert bool(said) == refused
    assert validation.head_adapter_problem(cfg.preset("tiny").model) is None  # LoRA on the layers only
    if refused:
        with pytest.raises(ConfigError, match="lora_targets = 'head'"):
            run.load_policy(grid, log=lambda line: None)
