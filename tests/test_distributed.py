"""Past one GPU, proven on CPU: the tiny run under `accelerate launch` with 2 processes (gloo), with vlrl's shipped
DDP config. Each process trains on its share of the prompts, gradients are averaged (the weights match a one-process
run over the same global batch), one process writes the run directory, evaluation is sharded and gathered in item
order, and a 2-process run resumes from its checkpoint to the adapter of an uninterrupted one. Two launches in all
(a launch's imports cost more than its steps). Also: the shipped accelerate configs, and the helpers in one
process."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlrl import run
from vlrl.base import distributed
from vlrl.base.errors import ConfigError
from vlrl.config import runfile as cfg
from vlrl.evaluation import sharded_eval

ROOT = Path(__file__).resolve().parent.parent

# Measured on the 2-core CPU machine: 3.1e-8 (the LoRA weights are about 0.1). Not 0: one process sums a batch of 8
# in one forward, two processes sum 4 each and average the two gradients, and their batches pad to other lengths,
# so the float32 sums round differently. Adam then scales every update to about the learning rate (2e-3), so a
# rounding difference stays a rounding difference unless a gradient element is itself at rounding level.
ONE_VS_TWO_TOLERANCE = 1e-6
RESUME_TOLERANCE = 1e-6  # as tests/test_train.py: bit-identical measured, margin for other BLAS builds


def launch(*args: str, output: Path, env: dict | None = None) -> subprocess.Popen:
    """`accelerate launch` of 2 processes on CPU with the shipped DDP config (one thread each: 2 cores), with `env`
    added to this process's environment."""
    with socket.socket() as s:  # a free port for the processes to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # PYTHONFAULTHANDLER: a process that dies of a signal (SIGABRT, SIGSEGV) prints the Python stack of each thread
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONFAULTHANDLER": "1", **(env or {})}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(distributed.accelerate_config("ddp")), "--num_processes", "2", "--main_process_port", str(port),
               *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=output.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(process: subprocess.Popen, output: Path) -> None:
    """Waits for the launch; on a failure prints everything its processes printed (pytest shows it under the
    failure's captured stdout): the launcher's summary at the end names only the signal, the cause is further up."""
    try:
        code = process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and its processes: a session of their own
        process.wait()
        code = "nothing: killed after 600 s"
    if code != 0:
        print(f"--- the whole output of the launch ({output}) ---\n{output.read_text()}--- end of the launch's output ---")
    assert code == 0, f"accelerate launch exited {code}; its processes' whole output is printed above"


class _threads:
    """torch's intra-op threads set for a block (the launched processes run with one each)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


# small: 2 steps of 2 prompts x 4 completions of 16 tokens; 16 held-out items in batches of 4, so each process
# generates two batches of each eval
SMALL = ["training.max_steps=2", "training.save_steps=1", "training.per_device_train_batch_size=4",
         "training.max_completion_length=16", "data.hold_out=16", "eval.batch_size=4", "eval.max_new_tokens=16"]


@pytest.fixture(scope="module")
def two_process_run(tiny_dir, tmp_path_factory) -> Path:
    """`vlrl run` of the small tiny run in 2 processes (`accelerate launch`, the shipped DDP config), into a directory
    holding an interrupted eval: the first 2 batches of a one-process eval (made here, in one/) and a torn line."""
    config = cfg.preset("tiny", overrides=SMALL, num_processes=2)
    out = tmp_path_factory.mktemp("two") / "run"
    one = out.with_name("one")
    with _threads(1):  # as each launched process
        policy, processor = run.load_policy(config, log=lambda *_: None)
        _, eval_ds = run.prepare(config, processor, log=lambda *_: None)
        run.evaluate_policy(config, policy, processor, eval_ds, one, "before", log=lambda *_: None)
    lines = (one / "eval_before.jsonl").read_text().splitlines(keepends=True)
    out.mkdir()
    (out / "eval_before.jsonl").write_text("".join(lines[:8]) + lines[8][:40])
    run_file = out.with_name("run.toml")
    run_file.write_text(cfg.to_toml(config))
    finish(launch("-m", "vlrl", "run", "--config", str(run_file), "--run-dir", str(out),
                  output=out.with_name("log")), out.with_name("log"))
    return out


def _files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir())


@pytest.mark.slow
def test_two_process_run_writes_the_run_directory_of_a_one_process_run(two_process_run):
    """One process wrote: the files of a one-process run, each log line once. The sharded eval resumed the
    interrupted one (its torn line dropped, its 8 records kept, the other 8 items generated, 2 batches of 4 by each
    process) into the one-process eval's file, line for line: greedy decoding of the same batches (`sharded_eval`)."""
    assert _files(two_process_run) == [
        "adapter", "checkpoints", "comparison.json", "config.toml", "data_report.json", "eval_after.jsonl",
        "eval_before.jsonl", "eval_images", "grpo_config.json", "plots", "report.html", "train_log.jsonl"]
    log = [json.loads(line) for line in (two_process_run / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "reward" in r] == [1, 2]
    assert (two_process_run / "checkpoints" / "checkpoint-2" / "rng_state_1.pth").exists()  # each process's RNG
    one = two_process_run.with_name("one") / "eval_before.jsonl"
    assert (two_process_run / "eval_before.jsonl").read_text() == one.read_text()
    printed = two_process_run.with_name("log").read_text()
    assert "eval: 8 items generated by 2 processes" in printed and "eval: 16 items generated by 2" in printed


@pytest.mark.slow
def test_two_processes_match_one_process_and_resume_to_the_same_adapter(two_process_run, tmp_path):
    """One launch of tests/two_process_worker.py, then the same steps in this process.

    1. Two processes x 4 completions against one process x 8: the same global batch (2 prompts x 4 completions),
       2 optimizer steps. Sampling cannot be compared across process counts (TRL seeds each process differently),
       so the rollouts are fixed, each prompt's group a function of the prompt alone. Everything DDP changes is
       real: which process gets which prompts, the group advantages over rewards gathered from both, the loss
       normalization, the gradient all-reduce, clipping and Adam. Both processes end with the same LoRA weights
       (exactly: DDP averages the gradients and both apply the same update); one process over the whole batch
       gets them up to float32 rounding.
    2. `vlrl train --resume` in the same 2 processes, of the 2-process run as a kill right after checkpoint-1 leaves
       it (its directory without what came later; tests/test_train.py kills a one-process run for real, and a
       third launch here would cost the suite half a minute), ends with the uninterrupted run's adapter: each
       process's optimizer and RNG state is restored by its own rank.
    """
    import two_process_worker

    resumed = tmp_path / "resumed"
    shutil.copytree(two_process_run, resumed, ignore=shutil.ignore_patterns(
        "checkpoint-2", "adapter", "eval_after.jsonl", "comparison.json", "report.html", "plots"))
    out = tmp_path / "two"
    out.mkdir()
    finish(launch(str(ROOT / "tests" / "two_process_worker.py"), str(out), "4", "2", str(resumed),
                  output=tmp_path / "log"), tmp_path / "log")

    rank0, rank1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    assert all(torch.count_nonzero(v) for k, v in rank0.items() if "lora_B" in k), "the steps did not train"
    one, seen = two_process_worker.train_steps(tmp_path / "one", per_device=8, steps=2)
    difference = max((one[k] - rank0[k]).abs().max().item() for k in one)
    print(f"one vs two processes: max |LoRA difference| = {difference:.3g} over {len(one)} tensors")
    assert difference <= ONE_VS_TWO_TOLERANCE, difference
    # each step's 2 prompts: the first went to process 0, the other to process 1
    shares = [json.loads((out / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert seen == [shares[0][0], shares[1][0], shares[0][1], shares[1][1]]

    a, b = (load_file(str(d / "adapter" / "adapter_model.safetensors")) for d in (two_process_run, resumed))
    difference = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"2-process resume: max |adapter difference| = {difference:.3g} over {len(a)} tensors")
    assert a.keys() == b.keys() and difference <= RESUME_TOLERANCE, difference
    logs = [[json.loads(line) for line in (d / "train_log.jsonl").read_text().splitlines()]
            for d in (two_process_run, resumed)]
    assert [r["step"] for r in logs[1] if "reward" in r] == [1, 2]  # cut back to checkpoint-1, then step 2 once
    assert [r["loss"] for r in logs[1] if "reward" in r] == pytest.approx([r["loss"] for r in logs[0] if "reward" in r])


@pytest.mark.slow
def test_merged_passes_in_two_processes_match_one_process(tiny_dir, tmp_path):
    """`[training] pass_tokens` under DDP: each process's two micro-batches of 2 trained as one pass, the first
    micro-step of each optimizer step empty (DDP's gradient all-reduce comes on the last, a real pass). Both processes
    end with the same LoRA weights, and those of one process over the whole batch one micro-batch at a time."""
    import two_process_worker

    out = tmp_path / "two"
    out.mkdir()
    merged = "training.gradient_accumulation_steps=2;training.pass_tokens=1000000"
    finish(launch(str(ROOT / "tests" / "two_process_worker.py"), str(out), "2", "2", output=tmp_path / "log",
                  env={"VLRL_WORKER_OVERRIDES": merged}), tmp_path / "log")
    rank0, rank1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    assert all(torch.count_nonzero(v) for k, v in rank0.items() if "lora_B" in k), "the steps did not train"
    one, _ = two_process_worker.train_steps(tmp_path / "one", per_device=8, steps=2)
    difference = max((one[k] - rank0[k]).abs().max().item() for k in one)
    assert difference <= ONE_VS_TWO_TOLERANCE, difference


@pytest.mark.slow
@pytest.mark.head_lora  # grid-tiny's LoRA on the output layer
def test_an_episode_run_trains_in_two_processes(tiny_dir, tmp_path):
    """`vlrl run` of a small grid run in 2 processes: each plays its half of every step's group and trains on it (the
    advantages over the whole group, gathered), the main process plays the evals and writes the run directory, and
    the run directory says 2 processes trained it."""
    config = cfg.preset("grid-tiny", num_processes=2, overrides=[
        "training.per_device_train_batch_size=2", "training.num_generations=4", "training.max_steps=2",
        "training.save_steps=1", "env.max_turns=2", "env.options={size=3, difficulty=1, max_turns=2, shaping=true}",
        "env.eval_seeds=4"])
    run_file, out = tmp_path / "grid.toml", tmp_path / "grid"
    run_file.write_text(cfg.to_toml(config))
    finish(launch("-m", "vlrl", "run", "--config", str(run_file), "--run-dir", str(out), output=tmp_path / "log"),
           tmp_path / "log")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["completions/turns_mean"] > 0 for r in steps)
    assert json.loads((out / "grpo_config.json").read_text())["vlrl"]["processes"] == 2
    assert (out / "checkpoints" / "checkpoint-2" / "rng_state_1.pth").exists()  # each process's RNG
    before = [json.loads(line) for line in (out / "eval_before.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in before] == [0, 1, 2, 3]  # written once, by the main process
    assert (out / "comparison.json").exists() and (out / "adapter" / "adapter_config.json").exists()


# --- one process, and the shipped files ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", distributed.ACCELERATE_CONFIGS)
def test_shipped_accelerate_configs_load_with_accelerates_own_reader(name):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    path = distributed.accelerate_config(name)
    loaded = load_config_from_file(str(path))
    expected = {"ddp": DistributedType.MULTI_GPU, "fsdp": DistributedType.FSDP, "zero3": DistributedType.DEEPSPEED}
    assert loaded.distributed_type == expected[name] and loaded.num_machines == 1 and not loaded.use_cpu
    assert "docs/multi-gpu.md" in path.read_text()  # each file says where it is explained
    if name == "fsdp":
        import transformers.models.qwen3_vl.modeling_qwen3_vl as qwen3_vl

        layers = loaded.fsdp_config["fsdp_transformer_layer_cls_to_wrap"].split(",")
        assert all(hasattr(qwen3_vl, layer) for layer in layers), layers  # the classes FSDP wraps exist
        assert loaded.fsdp_config["fsdp_version"] == 2
    if name == "zero3":
        assert loaded.deepspeed_config["zero_stage"] == 3


def test_one_process_helpers_do_not_wait_or_gather(tmp_path):
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (1, 0, True)
    assert distributed.all_gather({"a": 1}) == [{"a": 1}]
    with distributed.main_first():
        distributed.barrier()
    with pytest.raises(ValueError, match="boom"):
        distributed.on_main(lambda: (_ for _ in ()).throw(ValueError("boom")))
    distributed.end()  # no group to leave
    distributed.end(exit_code=0)  # nor a launched process to end: this one goes on


def test_launch_environment_is_read(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (4, 3, False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert distributed.sharded_launch() == "FSDP"


def test_validation_names_every_factor_of_the_global_batch_for_two_processes():
    config = cfg.preset("tiny")
    config.training.per_device_train_batch_size, config.training.gradient_accumulation_steps = 6, 3
    cfg.validate(config, num_processes=2)  # 6 x 2 x 3 = 36: 9 whole groups of 4
    with pytest.raises(ConfigError, match=r"x 1 process x gradient_accumulation_steps 3 = 18\) must be a multiple"):
        cfg.validate(config, num_processes=1)
    config.training.num_generations = 8
    with pytest.raises(ConfigError) as err:
        cfg.validate(config, num_processes=2)
    assert ("(per_device_train_batch_size 6 x 2 processes x gradient_accumulation_steps 3 = 36) must be a multiple "
            "of [training] num_generations = 8") in str(err.value)


def test_unsloth_and_4bit_sharding_are_refused_under_several_processes(monkeypatch):
    config = cfg.preset("tiny")
    config.model.backend = "unsloth"
    with pytest.raises(ConfigError, match=r'backend = "unsloth" runs in one process, and this launch has 2'):
        cfg.validate(config, num_processes=2)
    cfg.validate(config, num_processes=1)
    config.model.backend, config.model.load_in_4bit = "transformers", True
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match=r"load_in_4bit = true under DeepSpeed"):
        cfg.validate(config, num_processes=2)


def test_one_process_commands_are_refused_under_a_launch(monkeypatch, capsys):
    from vlrl.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["report", "--run-dir", "nowhere"]) == 1
    assert "vlrl report runs in one process, and this launch has 2" in capsys.readouterr().err


def test_sharded_eval_in_one_process_is_the_one_process_eval(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(sharded_eval.one_process, "evaluate", lambda *args, **kwargs: calls.append(kwargs) or [])
    assert sharded_eval.evaluate(None, None, [], tmp_path / "eval.jsonl", batch_size=4, max_new_tokens=8) == []
    assert calls == [{"batch_size": 4, "image_dir": None, "progress": True, "log": None, "max_new_tokens": 8}]


def test_a_sharded_eval_round_never_leaves_a_process_without_a_forward(monkeypatch, tmp_path):
    """Under FSDP every forward is a collective: a process whose share of the last round is empty decodes a stand-in
    item with the others and keeps nothing of it (3 items, 2 processes, batches of 1: process 1 has no third item)."""
    calls = []

    def evaluate(model, processor, rows, path, **kwargs):
        calls.append([r["id"] for r in rows])
        return [{"id": r["id"], "correct": True} for r in rows]

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    monkeypatch.setattr(distributed, "on_main", lambda fn, *a, **k: None)
    monkeypatch.setattr(distributed, "barrier", lambda: None)
    gathered = []
    monkeypatch.setattr(distributed, "all_gather", lambda mine: gathered.append(mine) or [mine])
    monkeypatch.setattr(sharded_eval.one_process, "evaluate", evaluate)
    rows = [{"id": f"item-{i}"} for i in range(3)]
    sharded_eval.evaluate(None, None, rows, tmp_path / "eval.jsonl", batch_size=1)
    assert calls[:2] == [["item-1"], ["item-2"]]  # round 2: its own share is empty, so item-2 stands in
    assert gathered == [[{"id": "item-1", "correct": True}], []]  # and nothing of the stand-in is kept


def test_sharded_decoding_stops_when_every_process_has(monkeypatch):
    from vlrl.engine import loop

    reduced = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, op: reduced.append(op) or t.zero_())
    assert loop._all_stopped(torch.tensor([True, True]), synced=False)
    assert not loop._all_stopped(torch.tensor([True, True]), synced=True)  # another process still decodes
    assert reduced == [torch.distributed.ReduceOp.MIN]
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="under FSDP: each process plays its own episodes"):
        cfg.preset("grid-tiny", overrides=["training.per_device_train_batch_size=4", "training.num_generations=4"],
                   num_processes=2)
