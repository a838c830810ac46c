"""TRL through one adapter (`vlrl.training.trl_bridge`): the import-time check of what vlrl relies on, one line when a
name is missing, and no TRL private name anywhere else in vlrl, its tests or its benchmarks."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BRIDGE = ROOT / "vlrl" / "training" / "trl_bridge.py"


def test_a_missing_private_name_stops_the_import_in_one_line():
    # a TRL whose GRPOTrainer lost a hook vlrl uses: importing the bridge (as build_trainer does) says so in one line
    code = ("import trl\n"
            "del trl.GRPOTrainer._calculate_rewards\n"
            "from vlrl.base.errors import VlrlError\n"
            "try:\n"
            "    from vlrl.training import trl_bridge\n"
            "except VlrlError as err:\n"
            "    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    import trl

    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and len(lines) == 1, out.stdout + out.stderr
    assert f"trl {trl.__version__}" in lines[0] and "GRPOTrainer._calculate_rewards" in lines[0]


def test_a_hook_whose_parameters_changed_is_named_with_what_it_takes_now():
    from trl import GRPOTrainer

    from vlrl.training import trl_bridge

    class Renamed(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, fields, num_generations):  # multimodal_fields renamed
            pass

    with pytest.raises(trl_bridge.TrlSurfaceError) as err:
        trl_bridge.check(Renamed)
    message = str(err.value)
    assert "\n" not in message and "_generate_single_turn parameter 'multimodal_fields'" in message
    assert "'fields'" in message  # what it takes now


def test_a_subclass_of_trls_trainer_passes_on_what_its_bases_set():
    # Unsloth's UnslothGRPOTrainer subclasses TRL's; its own source sets none of the attributes vlrl reads (on the GPU
    # machine the check read only the subclass's source and refused Unsloth's trainer: "no GRPOTrainer._metrics")
    from trl import GRPOTrainer

    from vlrl.training import trl_bridge

    class Patched(GRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trl_bridge.check(Patched)


def test_the_installed_trl_passes_and_a_setting_no_mixin_reads_is_refused():
    from trl import GRPOTrainer

    from vlrl.training import mismatch, trl_bridge

    trl_bridge.check()
    built = trl_bridge.trainer_class(GRPOTrainer, (mismatch.RolloutMismatch,))
    assert built is trl_bridge.trainer_class(GRPOTrainer, (mismatch.RolloutMismatch,))  # one class, not one per run
    with pytest.raises(TypeError, match="no setting 'importance_sampling_capp'"):
        built(settings={"importance_sampling_capp": 2.0})  # refused before TRL builds anything


def test_no_trl_private_name_outside_the_bridge():
    from vlrl.training import trl_bridge

    names = [*trl_bridge.HOOKS, "_full_logits_logps", "_chunked_logps", "_ChunkedLogProbFunction", "_ForwardRedirection",
             "_buffered_inputs", "_backward"]
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b|\._metrics\[|\._dist\.|\._step\b")
    files = [p for folder in ("vlrl", "tests", "bench", "scripts") for p in (ROOT / folder).rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files if p not in (BRIDGE, Path(__file__).resolve())
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_the_chunked_kernel_gives_each_tokens_log_prob_and_entropy():
    # TRL's kernel under either name (private in 1.14, trl.kernels in 1.16): the full softmax's numbers, by chunks
    import torch

    from vlrl.training import trl_bridge

    torch.manual_seed(0)
    hidden, weight, labels = torch.randn(5, 8, requires_grad=True), torch.randn(11, 8), torch.randint(0, 11, (5,))
    logps, entropies = trl_bridge.chunked_logps(hidden, weight, None, labels, 0.7, 4, None, 1.0)
    every = (hidden @ weight.T / 0.7).log_softmax(-1)
    assert torch.allclose(logps, every.gather(1, labels[:, None]).squeeze(1), atol=1e-5)
    assert torch.allclose(entropies, -(every.exp() * every).sum(-1), atol=1e-5)
    logps.sum().backward()  # the backward recomputes the chunks
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
