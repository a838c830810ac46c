"""Shared fixtures: the tiny Qwen3-VL (built and warm-started once per cache), its processor, generated items, and the
session's one tiny run (the walkthrough notebook's).

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
# what builds the model cache, once a session (qwen35_base: tests/test_qwen35.py's random tiny Qwen3.5s, seconds each)
CACHE_FIXTURES = {"tiny_base_dir", "tiny_dir", "tiny_processor", "qwen35_base"}
RUN_FIXTURES = {"walkthrough", "tiny_run"}  # fixtures that build a full run: a test using one (even through another) is slow


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """A test that needs a full tiny run is in the slow set whatever its own marks say, so that `-m "not slow"`
    (`make test-fast`) never builds a run."""
    for item in items:
        if RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _cache_entries() -> set[str]:
    """The models in the cache (llama.cpp's converters, also there, are fetched by `make test` before pytest)."""
    cache = Path(os.environ["VLRL_CACHE"])
    return {p.name for p in cache.iterdir() if p.name.startswith(("tiny-", "small-"))} if cache.is_dir() else set()


def _built_outside_the_shared_fixtures(test, built: set[str], where: str) -> None:
    """A test outside the slow set must not build anything in the model cache (a tiny model, a warm start) but
    through the shared fixtures: on a fresh machine (CI) that would cost `make test-fast` minutes."""
    if built and test is not None and not test.get_closest_marker("slow"):
        pytest.fail(f"{where} built {sorted(built)} in $VLRL_CACHE: take the shared fixture "
                    f"({', '.join(sorted(CACHE_FIXTURES))}) or mark the test slow", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    before = _cache_entries()  # the fixture's own dependencies are already set up
    result = yield
    if fixturedef.argname not in CACHE_FIXTURES:
        _built_outside_the_shared_fixtures(getattr(request, "_pyfuncitem", None), _cache_entries() - before,
                                           f"fixture {fixturedef.argname!r}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    before = _cache_entries()
    result = yield
    _built_outside_the_shared_fixtures(item, _cache_entries() - before, "the test")
    return result


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
def walkthrough(tmp_path_factory, tiny_dir):
    """The Jupyter walkthrough run top to bottom on the tiny preset (tests/walkthrough.py): (the executed notebook,
    its run directory). Its cells call the stages `vlrl run` calls, so its run directory is the session's one tiny run
    (`tiny_run`): a second full run of the same configuration would cost the suite a minute and prove nothing more
    (`vlrl run` itself, from scratch, runs in tests/test_distributed.py)."""
    from walkthrough import execute  # tests/walkthrough.py

    work = tmp_path_factory.mktemp("notebook")
    run_dir = work / "walkthrough"
    return execute(run_dir, work, "executed.ipynb"), run_dir


@pytest.fixture(scope="session")
def tiny_run(walkthrough) -> Path:
    """One finished run of the tiny preset with eval.samples=4 (config.toml, greedy and sampled evals,
    comparison.json with pass@k, a trained adapter): the walkthrough's, shared by the tests that read a run
    directory; tests that write into a run copy it first."""
    return walkthrough[1]


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TRACKIO_DIR, ignore_errors=True)
