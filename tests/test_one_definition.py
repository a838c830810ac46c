"""One definition of each thing, checked over the package's source: one writer of the answer tags, one definition
of the stop tokens and of the offline check, one place that sets the tokenizer's padding side, and every `vlrl.` name
the package mentions resolving."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vlrl"
TAGS = ("<SOLUTION>", "</SOLUTION>", "<REASONING>", "</REASONING>")


def sources():
    return sorted(PACKAGE.rglob("*.py"))


def code_strings(tree) -> list[ast.Constant]:
    """The string constants of a module's code: docstrings (and their examples) left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


# --- the answer tags ---------------------------------------------------------------------------------------------------

def test_answer_tags_are_written_by_answers_format_alone():
    written = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in sources() if path.name != "answers.py"
               for node in code_strings(ast.parse(path.read_text())) if any(tag in node.value for tag in TAGS)]
    assert not written, f"answer tags written outside vlrl.grammar.answers.FORMAT: {written}"


def test_environments_and_play_follow_the_format(monkeypatch):
    import random

    from vlrl.envs import base, make, play
    from vlrl.grammar.answers import AnswerFormat

    other = AnswerFormat(solution=("<ACT>", "</ACT>"))
    monkeypatch.setattr(base, "FORMAT", other)
    monkeypatch.setattr(play, "FORMAT", other)
    assert "e.g. <ACT>up</ACT>." in make("grid").describe()
    assert play.policy_reply("noop", ["noop"], random.Random(0)) == "<ACT>noop</ACT>"


# --- one definition each: the stop tokens, the offline check -----------------------------------------------------------

def test_the_stop_tokens_are_defined_by_the_engine_alone():
    readers = sorted(str(path.relative_to(ROOT)) for path in sources()
                     if any(isinstance(node, ast.Attribute) and node.attr == "eos_token_id"
                            for node in ast.walk(ast.parse(path.read_text()))))
    assert readers == ["vlrl/engine/__init__.py"], readers  # stop_ids: evals, rollouts and episode turns use it
    evaluate = (PACKAGE / "evaluation" / "evaluate.py").read_text()
    assert "ids[:-1]" not in evaluate and "content_ids" in evaluate  # the stop token's place is the engine's rule


def test_hf_hub_offline_is_read_in_one_place(monkeypatch):
    readers = sorted(str(path.relative_to(ROOT)) for path in sources()
                     if re.search(r"environ(\.get\(|\[)\s*[\"']HF_HUB_OFFLINE", path.read_text()))
    assert readers == ["vlrl/base/cache.py"], readers
    from vlrl.base.errors import ConfigError
    from vlrl.model import loading as model

    def missing(*args):
        raise OSError("no such checkpoint")

    monkeypatch.setattr(model, "_load_transformers", missing)
    for value, offline in (("0", False), ("1", True)):  # "0" once read as offline in one message, online in another
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        with pytest.raises(ConfigError) as err:
            model.load_model("nowhere/model", backend="transformers")
        assert ("HF_HUB_OFFLINE is set" in str(err.value)) == offline
        assert model.environment()["hub"].startswith("offline") == offline


# --- names the package gives ---------------------------------------------------------------------------------------------

def test_every_vlrl_name_the_package_mentions_exists():
    """sections.py once pointed at a `vlrl.grammar.rewards.REWARD_SETS` that never existed."""
    missing = []
    for path in sources():
        if path == PACKAGE / "__init__.py":  # its MOVED table names the old modules on purpose
            continue
        for ref in sorted(set(re.findall(r"\bvlrl(?:\.[A-Za-z_]\w*)+", path.read_text()))):
            parts, obj, cut = ref.split("."), None, 1
            for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                    break
                except ImportError:
                    continue
            for name in parts[cut:]:
                if not hasattr(obj, name):
                    missing.append(f"{path.relative_to(ROOT)}: {ref}")
                    break
                obj = getattr(obj, name)
    assert not missing, missing


# --- the padding side ------------------------------------------------------------------------------------------------------

def test_no_module_flips_the_tokenizers_padding_side():
    """Set once where a processor is loaded (TRL's trainer calls it without a side); every vlrl call names its own."""
    setters = sorted(f"{path.relative_to(ROOT)}:{node.lineno}" for path in sources()
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "padding_side"
                                                             for t in node.targets))
    assert [s.split(":")[0] for s in setters] == ["vlrl/model/loading.py"], setters
    source = (PACKAGE / "model" / "loading.py").read_text()
    calls = re.findall(r"^\s+_pad_left_for_trl\(processor\)$", source, flags=re.MULTILINE)
    assert len(calls) == 2  # the transformers and Unsloth loaders, nowhere else


def test_a_batch_names_its_padding_side_and_leaves_the_tokenizer_alone(tiny_base_dir):
    from PIL import Image
    from transformers import AutoProcessor

    from vlrl.model.prompts import batch_inputs

    processor = AutoProcessor.from_pretrained(tiny_base_dir)  # its own copy: the shared fixture stays untouched
    processor.tokenizer.padding_side = "right"
    texts = ["<|vision_start|><|image_pad|><|vision_end|>a", "<|vision_start|><|image_pad|><|vision_end|>a b c d"]
    pictures = [Image.new("RGB", (32, 32)), Image.new("RGB", (32, 32))]
    left = batch_inputs(processor, texts, pictures, padding_side="left")
    right = batch_inputs(processor, texts, pictures, padding_side="right")
    assert left["attention_mask"][0, 0] == 0 and left["attention_mask"][0, -1] == 1
    assert right["attention_mask"][0, 0] == 1 and right["attention_mask"][0, -1] == 0
    assert processor.tokenizer.padding_side == "right"
