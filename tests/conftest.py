"""Shared fixtures: the tiny Qwen3-VL (built and warm-started once per cache), its processor, generated items.

The cache lives in $VLRL_CACHE (default: .cache/vlrl inside the repository, so CI builds it once per checkout).
Nothing here touches a model hub.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("VLRL_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "vlrl"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reaches for a hub fails at once instead of hanging
# trackio fixes its store's location when first imported (importing TRL does that): the tests' runs go to a store of
# their own, removed at the end, never the user's ~/.cache/huggingface/trackio, and never to a Space or a server
TRACKIO_DIR = os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="vlrl-trackio-")
for variable in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
    os.environ.pop(variable, None)

TINY_WARM = {"warm_start_steps": 150, "image_size": 64}  # what the tiny preset uses: one cached model for all tests
TINY_RUN_SAMPLES = 4  # the shared tiny run also samples 4 draws per item: pass@k end to end
RUN_FIXTURES = {"tiny_run"}  # fixtures that build a full `vlrl run`: a test using one (even through another) is slow


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """A test that needs a full tiny run is in the slow set whatever its own marks say, so that `-m "not slow"`
    (`make test-fast`) never builds a run."""
    for item in items:
        if RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_base_dir() -> Path:
    """The random tiny Qwen3-VL (no warm start)."""
    from vlrl.warmstart import ensure_tiny

    return ensure_tiny(warm_start_steps=0)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The warm-started tiny Qwen3-VL, as the tiny preset uses it."""
    from vlrl.warmstart import ensure_tiny

    return ensure_tiny(**TINY_WARM)


@pytest.fixture(scope="session")
def tiny_processor(tiny_base_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_base_dir)


@pytest.fixture
def items():
    from vlrl import synthetic

    return synthetic.generate(24, seed=1, image_size=64)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_dir) -> Path:
    """One finished `vlrl run --preset tiny --set eval.samples=4` (config.toml, greedy and sampled evals,
    comparison.json with pass@k, a trained adapter), shared by the tests that read a run directory; tests that write
    into a run copy it first."""
    from vlrl.cli import main

    out = tmp_path_factory.mktemp("run") / "demo"
    assert main(["run", "--preset", "tiny", "--run-dir", str(out), "--set", f"eval.samples={TINY_RUN_SAMPLES}"]) == 0
    return out


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TRACKIO_DIR, ignore_errors=True)
