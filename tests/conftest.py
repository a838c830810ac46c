"""Shared fixtures: the tiny Qwen3-VL (built and warm-started once per cache), its processor, generated items, and the
session's one tiny run (the walkthrough notebook's).

The cache lives in $VLRL_CACHE (default: .cache/vlrl inside the repository, so CI builds it once per checkout).
Nothing here touches a model hub.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

CACHE = os.environ.setdefault("VLRL_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "vlrl"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reaches for a hub fails at once instead of hanging
# Before torch is imported: its CPU tensors of 2 MB and more on transparent huge pages, so allocating one (the tiny
# model's logits over Qwen's 151,936-token vocabulary are ~200 MB a step) faults in 2 MB pages instead of 4 kB ones:
# a tiny `vlrl run` on one core spent 10.1 s in the kernel and 6.3-7.5 s with it (wall 38.9 -> 33.4 s, 41.3 ->
# 38.6 s). Subprocesses (notebook kernels, `accelerate launch`) inherit it.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # before torch is imported: pytest-xdist's workers share the cores
    # (`make test-fast` on the 2-core machine: 138 s in one process, 116 s in two workers of two threads each, 96 s
    # in two of one thread each: threads waiting for a core another worker holds only burn it)
    cores_each = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores_each)))
# trackio fixes its store's location when first imported (importing TRL does that): the tests' runs go to a store of
# their own, removed at the end, never the user's ~/.cache/huggingface/trackio, and never to a Space or a server
TRACKIO_DIR = os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="vlrl-trackio-")
for variable in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
    os.environ.pop(variable, None)

TINY_WARM = {"warm_start_steps": 150, "image_size": 64}  # what the tiny preset uses: one cached model for all tests
# what builds the model cache, once a session (qwen35_base: tests/test_qwen35.py's random tiny Qwen3.5s, seconds each)
CACHE_FIXTURES = {"tiny_base_dir", "tiny_dir", "tiny_processor", "qwen35_base"}
# each long test's seconds (setup and call) on the 2-core development machine: `make test PYTEST_ARGS=--durations=60`,
# the tests over 4 s; a test missing here counts as quick (0 s) and runs after them
DURATIONS = Path(__file__).with_name("durations.json")
RUN_FIXTURES = {"walkthrough", "tiny_run"}  # fixtures that build a full run: a test using one (even through another) is slow


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """A test that needs a full tiny run is in the slow set whatever its own marks say, so that `-m "not slow"`
    (`make test-fast`) never builds a run. The order of what is left is `Order`'s."""
    for item in _readers(items):
        item.add_marker(pytest.mark.slow)
    refused = _head_lora_refused()
    for item in items:
        if refused and item.get_closest_marker("head_lora"):
            item.add_marker(pytest.mark.skip(reason=refused))


def _head_lora_refused() -> str | None:
    """The one line vlrl says where the installed TRL refuses a LoRA on the output layer (TRL >= 1.16), else None."""
    from types import SimpleNamespace

    from vlrl.config.validation import head_adapter_problem

    return head_adapter_problem(SimpleNamespace(lora_targets="head"))


def _readers(items) -> list:
    return [item for item in items if RUN_FIXTURES & set(getattr(item, "fixturenames", ()))]


def _units(items) -> list[list]:
    """The items in groups that one worker runs back to back, in file order: a module- or class-scoped fixture is
    set up once for the tests that use it only while they run one after another in one process (pytest tears it
    down when the next test is elsewhere; a second setup in the same process can meet the first one's leftovers, as
    the tracking tests' run in the session's one trackio store did)."""
    unit_of: dict[tuple, list] = {}
    units: list[list] = []
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        keys = [(item.nodeid.split("::")[0], name) for name, defs in (info.name2fixturedefs.items() if info else ())
                if defs and defs[-1].scope in ("module", "class", "package")]
        joined = list({id(unit_of[key]): unit_of[key] for key in keys if key in unit_of}.values())
        unit = joined[0] if joined else []
        if not joined:
            units.append(unit)
        for other in joined[1:]:  # two groups met through this item: one group
            unit += other
            units = [kept for kept in units if kept is not other]
            for key, value in unit_of.items():
                if value is other:
                    unit_of[key] = unit
        unit.append(item)
        for key in keys:
            unit_of[key] = unit
    return units


class Order:
    """The tests' order for pytest-xdist's work stealing (`make test`: `--dist worksteal`), which gives worker k the
    k-th of equal consecutive shares of the list and lets an idle worker take the second half of the longest queue
    left. The tests go in units (`_units`: those sharing a module-scoped fixture stay together, in file order). Each
    share starts with its part of the long units (their seconds: `DURATIONS`), longest first, dealt to the share with
    the least so far (the longest-first rule); the run's readers lead the first share together (its worker makes the
    run, `walkthrough`, and reads it; another would wait for it); the quick units then fill the shares in file
    order, and what is stolen near the end is short, so the workers finish together."""

    @pytest.hookimpl(trylast=True)  # after `-m` deselects: the shares are of what runs
    def pytest_collection_modifyitems(self, config, items):
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        readers = {id(item) for item in _readers(items)}
        position = {id(item): k for k, item in enumerate(items)}
        units = [sorted(unit, key=lambda item: position[id(item)]) for unit in _units(items)]
        led = [any(id(item) in readers for item in unit) for unit in units]  # units holding a reader
        head = [item for unit, reads in zip(units, led) if reads for item in unit]
        timed = [(sum(seconds.get(item.nodeid, 0) for item in unit), unit) for unit, reads in zip(units, led)
                 if not reads]
        long = ([(sum(seconds.get(item.nodeid, 0) for item in head), head)] if head else []) + sorted(
            ((total, unit) for total, unit in timed if total), key=lambda pair: -pair[0])
        quick = [unit for total, unit in timed if not total]
        shares, load = [[] for _ in range(workers)], [0.0] * workers
        for total, unit in long:  # the readers first: the first share's head
            k = load.index(min(load))
            shares[k] += unit
            load[k] += total
        sizes, left = [], len(items)
        for k in range(workers):  # pytest-xdist's first split: each idle worker takes left // workers_remaining
            sizes.append(left // (workers - k))
            left -= sizes[-1]
        for k, share in enumerate(shares):
            while quick and len(share) < sizes[k]:
                share += quick.pop(0)
        items[:] = [item for share in shares for item in share] + [item for unit in quick for item in unit]


def pytest_configure(config):
    config.pluginmanager.register(Order(), "vlrl-test-order")


BUILT: list[str] = []  # the model-cache entries this process built, in order


def _record_builds() -> None:
    """Every build of the model cache (a tiny model, a warm start) ends in `vlrl.model.tiny.replace_dir`; noted there, the
    builds are this process's own: pytest-xdist's other workers fill the same cache meanwhile, so a listing of the
    cache before and after a test would blame it for theirs. (A build in a subprocess goes unseen: no test outside
    the slow set starts one that loads a model.)"""
    from vlrl.model import tiny

    replace_dir = tiny.replace_dir

    def replace_dir_and_note(tmp: Path, final: Path) -> None:
        replace_dir(tmp, final)
        BUILT.append(final.name)

    tiny.replace_dir = replace_dir_and_note


_record_builds()


def _built_outside_the_shared_fixtures(test, built: list[str], where: str) -> None:
    """A test outside the slow set must not build anything in the model cache (a tiny model, a warm start) but
    through the shared fixtures: on a fresh machine (CI) that would cost `make test-fast` minutes."""
    if built and test is not None and not test.get_closest_marker("slow"):
        pytest.fail(f"{where} built {built} in $VLRL_CACHE: take the shared fixture "
                    f"({', '.join(sorted(CACHE_FIXTURES))}) or mark the test slow", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    before = len(BUILT)  # the fixture's own dependencies are already set up
    result = yield
    if fixturedef.argname not in CACHE_FIXTURES:
        _built_outside_the_shared_fixtures(getattr(request, "_pyfuncitem", None), BUILT[before:],
                                           f"fixture {fixturedef.argname!r}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    before = len(BUILT)
    result = yield
    _built_outside_the_shared_fixtures(item, BUILT[before:], "the test")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    """A test that points $VLRL_CACHE elsewhere puts it back (monkeypatch.setenv): the tests after it in the same
    process (a pytest-xdist worker runs a share of them, in no fixed order) would otherwise rebuild every model there
    (vlrl.base.cache's doctest did: minutes of `make test`). This conftest sees only tests/, so a doctest in vlrl/ that
    leaks it is caught at the next test's teardown."""
    result = yield
    if os.environ.get("VLRL_CACHE") != CACHE:
        left, os.environ["VLRL_CACHE"] = os.environ.get("VLRL_CACHE"), CACHE
        pytest.fail(f"VLRL_CACHE is {left!r} after this test (set by it, or by a doctest run before it in this "
                    f"process): set it with monkeypatch.setenv, or mock.patch.dict in a doctest", pytrace=False)
    return result


@pytest.fixture(scope="session")
def tiny_base_dir() -> Path:
    """The random tiny Qwen3-VL (no warm start)."""
    from vlrl.training.warmstart import ensure_tiny

    return ensure_tiny(warm_start_steps=0)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The warm-started tiny Qwen3-VL, as the tiny preset uses it."""
    from vlrl.training.warmstart import ensure_tiny

    return ensure_tiny(**TINY_WARM)


@pytest.fixture(scope="session")
def tiny_processor(tiny_base_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_base_dir)


@pytest.fixture
def items():
    from vlrl.base import synthetic

    return synthetic.generate(24, seed=1, image_size=64)


@pytest.fixture(scope="session")
def walkthrough(tmp_path_factory, tiny_dir):
    """The Jupyter walkthrough run top to bottom on the tiny preset (tests/walkthrough.py): (the executed notebook,
    its run directory). Its cells call the stages `vlrl run` calls, so its run directory is the session's one tiny run
    (`tiny_run`): a second full run of the same configuration would cost the suite a minute and prove nothing more
    (`vlrl run` itself, from scratch, runs in tests/test_distributed.py)."""
    import nbformat
    from filelock import FileLock
    from walkthrough import execute  # tests/walkthrough.py

    # pytest-xdist's workers share the session's temporary root: the first to need the run makes it, the others wait
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    work = root / "notebook"
    run_dir, executed = work / "walkthrough", work / "executed.ipynb"
    with FileLock(root / "notebook.lock"):
        if executed.exists():
            return nbformat.read(executed, as_version=4), run_dir
        if work.exists():
            pytest.fail("the walkthrough failed in another pytest-xdist worker: its error is reported there")
        work.mkdir()
        return execute(run_dir, work, executed.name), run_dir


@pytest.fixture(scope="session")
def tiny_run(walkthrough) -> Path:
    """One finished run of the tiny preset with eval.samples=4 (config.toml, greedy and sampled evals,
    comparison.json with pass@k, a trained adapter): the walkthrough's, shared by the tests that read a run
    directory; tests that write into a run copy it first."""
    return walkthrough[1]


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TRACKIO_DIR, ignore_errors=True)
