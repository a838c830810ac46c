"""The Jupyter walkthrough: stored clean and thin, and run top to bottom on the tiny preset with nbclient, its
parameters injected the papermill way; every cell runs, and the run directory holds what the stages promise."""

import ast
import json
import shutil

import nbformat
import pytest
from walkthrough import NOTEBOOK, execute  # tests/walkthrough.py

RUN_FILES = ("config.toml", "data_report.json", "eval_before.jsonl", "train_log.jsonl", "grpo_config.json",
             "eval_after.jsonl", "comparison.json", "report.html", "plots/training.png", "plots/comparison.png",
             "adapter/adapter_model.safetensors", "adapter/adapter_config.json")
STAGES = ("1. Environment", "2. Model load", "3. LoRA wrap", "4. Data", "5. Baseline eval", "6. GSPO training",
          "7. Post-training eval", "8. Export")


def _notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def _code(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_notebook_is_stored_without_outputs():
    nb = _notebook()
    nbformat.validate(nb)
    for cell in _code(nb):
        assert cell.outputs == [] and cell.execution_count is None, f"cell {cell.id} is stored with outputs"


def test_parameters_cell_defaults_to_the_tiny_preset():
    nb = _notebook()
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code"
    statements = ast.parse(tagged[0].source).body
    assert all(isinstance(s, ast.Assign) for s in statements)  # plain assignments: papermill overrides each one
    values = {s.targets[0].id: ast.literal_eval(s.value) for s in statements}
    assert values == {"preset": "tiny", "run_dir": "runs/walkthrough", "samples": 4}
    from vlrl.config import runfile as config

    assert "qwen3-vl-8b-mathvista" in config.presets()  # the preset the parameters cell names for a GPU


def test_notebook_has_the_eight_stages_and_defines_nothing():
    nb = _notebook()
    headings = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("## ")]
    assert [h[3:].split(" and ")[0] for h in headings] == list(STAGES)
    for cell in _code(nb):  # thin over vlrl: anything beyond a call belongs in the library
        for word in ("def ", "class ", "lambda"):
            assert word not in cell.source, f"cell {cell.id} defines something ({word.strip()}): move it into vlrl"


@pytest.fixture(scope="module")
def executed(walkthrough):
    """The walkthrough run top to bottom on the tiny preset into a fresh run directory (conftest: once a session, the
    shared tiny run): the executed notebook and its run directory."""
    return walkthrough


def _outputs(nb, cell_id: str) -> str:
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    parts = []
    for output in cell.outputs:
        parts.append(output.get("text", ""))
        for mime, value in output.get("data", {}).items():
            parts.append(f"[{mime}]" + (value if isinstance(value, str) else ""))
    return "\n".join(parts)


@pytest.mark.slow
def test_every_cell_ran_without_error(executed):
    nb, _ = executed
    cells = _code(nb)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in cells)
    for cell in cells:
        assert cell.execution_count is not None, f"cell {cell.id} did not run"
        assert not [o for o in cell.outputs if o.output_type == "error"], f"cell {cell.id} raised"
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))  # top to bottom, once each


@pytest.mark.slow
def test_run_directory_holds_what_the_stages_promise(executed):
    from vlrl import export
    from vlrl.config import runfile as config
    from vlrl.evaluation.compare import compare, with_samples
    from vlrl.evaluation.records import image_paths, read_records

    _, run_dir = executed
    for name in RUN_FILES:
        assert (run_dir / name).is_file(), name
    tiny = config.preset("tiny", overrides=["eval.samples=4"])  # the walkthrough samples 4 draws per item
    assert config.load(run_dir / "config.toml") == tiny
    before = read_records(run_dir / "eval_before.jsonl")
    after = read_records(run_dir / "eval_after.jsonl")
    assert len(before) == len(after) == tiny.data.hold_out
    expected = with_samples(compare(before, after), run_dir / "samples_before.jsonl", run_dir / "samples_after.jsonl")
    assert json.loads((run_dir / "comparison.json").read_text()) == json.loads(json.dumps(expected))
    assert expected["pass_at_k"]["k"] == [1, 2, 3, 4]
    steps = {r["step"] for r in read_records(run_dir / "train_log.jsonl") if "reward" in r}
    assert steps == set(range(1, tiny.training.max_steps + 1))
    for record in before:
        assert image_paths(run_dir / "eval_images", record["id"])
    stats = export.verify_adapter(run_dir / "adapter")
    assert stats["nonzero_lora_B"] > 0 and stats["all_finite"]


@pytest.mark.slow
def test_stages_show_what_they_did(executed):
    nb, run_dir = executed
    assert "<td>backend</td><td><code>transformers</code></td>" in _outputs(nb, "environment")
    assert "<td>lora_layers</td>" not in _outputs(nb, "model-load")  # the base model is shown before LoRA
    lora = _outputs(nb, "lora-wrap")
    assert "<td>lora_layers</td>" in lora and "<td>vision_trainable</td><td><code>false</code></td>" in lora
    data = _outputs(nb, "data")
    assert data.count('<img alt="image of') == 3 and "&lt;|vision_start|&gt;" in data  # items with images and prompts
    sample = _outputs(nb, "sample-completion")
    record = json.loads((run_dir / "eval_before.jsonl").read_text().splitlines()[0])
    assert "<td><b>total R</b></td>" in sample and f"<b>{record['reward']:g}</b>" in sample
    assert "[image/png]" in _outputs(nb, "training-curves")
    comparison = _outputs(nb, "comparison")
    assert "[image/png]" in comparison and "McNemar exact p" in comparison and "class=ci" in comparison
    flipped = json.loads((run_dir / "comparison.json").read_text())
    curve = _outputs(nb, "passk-curve")  # the pass@k curves before and after, and the sentence on what they mean
    assert "[image/png]" in curve and "pass@4" in curve and flipped["pass_at_k"]["meaning"][:40] in curve
    flips = _outputs(nb, "flips")
    assert "Wrong &rarr; right" in flips and "Right &rarr; wrong" in flips
    if flipped["wrong_to_right"] or flipped["right_to_wrong"]:
        assert '<img alt="image of' in flips
    exported = _outputs(nb, "export")
    assert "<td>adapter_model.safetensors</td>" in exported and "<td>nonzero_lora_B</td>" in exported
    assert "<td>report.html</td>" in _outputs(nb, "run-dir")


@pytest.mark.slow
def test_run_all_a_second_time_continues_in_its_run_directory(executed, tmp_path):
    # Run All twice (or after an interruption): every cell runs again over the same run directory, the baseline
    # records are kept, finished training is not repeated and says so, and the eval after it is scored anew.
    run_dir = tmp_path / "walkthrough"  # a copy: the first run's directory is the session's shared tiny run
    shutil.copytree(executed[1], run_dir)
    before = (run_dir / "eval_before.jsonl").read_text()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    again = execute(run_dir, tmp_path, "executed-again.ipynb")
    for cell in _code(again):
        assert not [o for o in cell.outputs if o.output_type == "error"], f"cell {cell.id} raised the second time"
    assert "training is done (checkpoint-8, step 8 of 8" in _outputs(again, "train")
    assert "0 items generated (32 resumed from eval_before.jsonl)" in _outputs(again, "baseline-eval")
    assert (run_dir / "eval_before.jsonl").read_text() == before
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoints  # no checkpoint-9
    assert json.loads((run_dir / "comparison.json").read_text())["n_paired"] == 32


def test_the_readme_names_the_parameters_the_notebook_has():
    tagged = next(c for c in _notebook().cells if "parameters" in c.metadata.get("tags", []))
    names = [s.targets[0].id for s in ast.parse(tagged.source).body]
    readme = (NOTEBOOK.parent / "README.md").read_text()
    table = [line.split("`")[1] for line in readme.split("## Parameters")[1].split("\n## ")[0].splitlines()
             if line.startswith("| `")]
    assert table == names
    intro = _notebook().cells[0].source
    assert all(f"`{name}`" in intro for name in names) and "output_dir" not in intro
    main_readme = (NOTEBOOK.parent.parent / "README.md").read_text()
    walkthrough = main_readme.split("## The walkthrough notebook")[1].split("\n## ")[0]
    assert all(f"`{name}`" in walkthrough for name in names)
    for text in (intro, readme, walkthrough):  # the same time everywhere (measured: tests/test_notebook.py prints it)
        assert "3 to 5 minutes" in " ".join(text.split())
