"""What `vlrl validate` builds beyond the configuration's rules, where that is cheap: the run's environment (built
from [env] and reset once; a server's /health asked, with a short timeout), and the first rows of a local data
source ([data], [eval] source) read and converted to the canonical schema, and the model's name: a model vlrl
builds, a local directory, or a hub id in the local hub cache or answered for by the hub (one request with a short
timeout, no retries; `vlrl.model.source`). A model is never loaded and a hub data set never read.

    checked, problems = preflight(config.preset("grid-tiny"))
    # (["environment 'grid': built and reset to seed 0 (a 64x64 picture, 4 actions)"], [])
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from vlrl.base.errors import VlrlError

FIRST_ROWS = 8  # rows of a local source read and converted: enough to see the columns, the answers and the pictures
HEALTH_TIMEOUT_S = 3.0


def preflight(config) -> tuple[list[str], list[str]]:
    """Builds what `config` names that can be built cheaply. Returns (what was checked, one line each; every problem
    found, one line each with the fix). An episode run checks its environment, a single-turn run its data."""
    from vlrl.config.validation import head_adapter_problem

    checked, problems = [], []
    _check_model(config.model.name_or_path, checked, problems)
    problems += [p for p in [head_adapter_problem(config.model)] if p]
    if config.env.name:
        _check_environment(config, checked, problems)
    else:
        _check_data("[data]", config.data.source, config.data.split, config, checked, problems)
        if config.eval.source:
            _check_data("[eval]", config.eval.source, config.eval.split, config, checked, problems)
    return checked, problems


# --- the model ---------------------------------------------------------------------------------------------------------

def _check_model(name: str, checked: list[str], problems: list[str]) -> None:
    """A model vlrl builds, a local directory, or a hub id in the local hub cache or answered for by the hub (one
    request, a short timeout, no retries: `vlrl.model.source`)."""
    from vlrl.config.sections import LOCAL_MODELS
    from vlrl.model.source import model_source_problem

    if name in LOCAL_MODELS:
        checked.append(f"[model] name_or_path = {name!r}: a model vlrl builds (and caches) on first use")
        return
    problem = model_source_problem(name)
    if problem:
        problems.append(f"[model] name_or_path = {name!r}: {problem}")
    else:
        where = "a local directory" if Path(name).expanduser().is_dir() else "a hub id it can load"
        checked.append(f"[model] name_or_path = {name!r}: {where} (not loaded here)")


# --- the environment -------------------------------------------------------------------------------------------------

def _check_environment(config, checked: list[str], problems: list[str]) -> None:
    from vlrl.config.sections import ENV_SEEDS
    from vlrl.envs import env_options, make

    name, options = config.env.name, env_options(config.env)
    if name.startswith(("http://", "https://", "openenv:")):
        url = name.removeprefix("openenv:").rstrip("/")
        problem = health_problem(url)
        if problem:
            problems.append(f"[env] name = {name!r}: {problem}")
            return
        if not name.startswith("openenv:") and config.env.options:  # a vlrl server checks the options it would build
            problem = _served_options_problem(url, config.env.options)
            if problem:
                problems.append(f"[env] options: {problem}")
                return
        checked.append(f"environment {name!r}: the server answered /health (not reset: its episodes are its own)")
        return
    seed = ENV_SEEDS["eval"]
    try:
        env = make(name, **options)
        try:
            observation = env.reset(seed)
            actions = len(env.actions)
        finally:
            env.close()
    except VlrlError as err:
        problems.append(f"[env] {err}")
        return
    except Exception as err:  # noqa: BLE001 -- the environment's own failure, said in one line
        problems.append(f"[env] name = {name!r} raised {type(err).__name__} when built and reset to seed {seed}: "
                        f"{str(err)[:200]}")
        return
    picture = (f"a {observation.image.size[0]}x{observation.image.size[1]} picture" if observation.image is not None
               else "no picture")
    checked.append(f"environment {name!r}: built and reset to seed {seed} ({picture}, {actions} actions)")


def health_problem(url: str, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """None when an environment server answers GET /health at `url` within `timeout` seconds, else what went wrong
    and the fix.

    >>> health_problem("http://127.0.0.1:9", timeout=0.5).startswith("no environment server answered")
    True
    """
    from vlrl.envs.remote import auth_headers
    from vlrl.model.source import unreachable_reason

    request = urllib.request.Request(url + "/health", headers=auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
        return None
    except urllib.error.HTTPError as err:
        return (f"{url}/health answered {err.code} ({err.reason}); is it an environment server (`vlrl serve-env`, "
                "OpenEnv), and is ENVIRONMENT_API_KEY its key?")
    except (urllib.error.URLError, OSError, ValueError) as err:
        return (f"no environment server answered at {url}/health ({unreachable_reason(err, timeout)}); start it "
                "first (`vlrl serve-env NAME` on that port), or check the address.")


def _served_options_problem(url: str, options: dict) -> str | None:
    """What a `vlrl serve-env` server says of `options` (GET /task_info?options=..., its 400), None when it takes
    them."""
    from vlrl.envs.remote import auth_headers

    query = urllib.parse.urlencode({"options": json.dumps(options)})
    request = urllib.request.Request(f"{url}/task_info?{query}", headers=auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=HEALTH_TIMEOUT_S) as response:
            response.read()
        return None
    except urllib.error.HTTPError as err:
        try:
            reason = json.loads(err.read()).get("error", "")
        except ValueError:
            reason = err.reason
        return f"the server at {url} refused them ({err.code}): {reason}"
    except (urllib.error.URLError, OSError) as err:
        return f"the server at {url} did not answer /task_info ({getattr(err, 'reason', err)})"


# --- the data ----------------------------------------------------------------------------------------------------------

def _check_data(section: str, source: str, split: str, config, checked: list[str], problems: list[str]) -> None:
    from vlrl.base import synthetic
    from vlrl.data.choose import load_synthetic

    if source == "synthetic":
        d = config.data
        try:
            rows = load_synthetic(min(2, max(1, d.num_items)), seed=d.seed, image_size=d.image_size,
                                  difficulty=d.difficulty, tasks=d.tasks or synthetic.TASKS)
        except VlrlError as err:
            problems.append(f"{section} {err}")
            return
        checked.append(f"{section} source = \"synthetic\": {len(rows)} items generated")
        return
    if not Path(source).exists():
        checked.append(f"{section} source = {source!r}: not read (a hub id: `vlrl validate` never contacts the hub; "
                       "`vlrl data inspect` reads it)")
        return
    try:
        head = first_rows(source, split, FIRST_ROWS)
    except (OSError, ValueError) as err:
        problems.append(f"{section} source = {source!r} cannot be read ({type(err).__name__}: {err}).")
        return
    if head is None:
        checked.append(f"{section} source = {source!r}: not read here (its layout is read whole by `vlrl run`)")
        return
    rows, root = head
    try:
        report = _convert(rows, root, source, split, config, section)
    except VlrlError as err:
        said = str(err).replace("<list> (split", "(split")  # the rows were handed over as a list: name the source
        problems.append(f"{section} source = {source!r}: its first {len(rows)} rows {said}")
        return
    skipped = "".join(f", {n} {reason} (e.g. {report.examples[reason][0]})" for reason, n in report.skipped.items())
    checked.append(f"{section} source = {source!r}: first {report.rows_read} rows read, {report.rows_kept} usable"
                   f"{skipped}")
    if "not UTF-8" not in skipped:  # the first rows named one already; the run's data report lists them all
        _check_encoding(section, source, split, checked)


def _check_encoding(section: str, source: str, split: str, checked: list[str]) -> None:
    """A JSON source's lines that are not UTF-8, over the whole file (the first rows may not reach them): `vlrl run`
    skips each as an invalid_record; said here with the line and the fix."""
    from vlrl.data.sources import non_utf8_lines

    path = Path(source)
    files = [path] if path.is_file() else [path / f"{split}.jsonl", path / f"{split}.json"]
    file = next((f for f in files if f.is_file() and f.suffix in (".json", ".jsonl")), None)
    bad = non_utf8_lines(file) if file is not None else []
    if bad:
        skipped = "skips them as invalid_record" if file.suffix == ".jsonl" else "refuses the file"
        checked.append(f"{section} source = {source!r}: {len(bad)} line(s) of {file.name} not UTF-8, `vlrl run` "
                       f"{skipped}: {bad[0]}")


def _convert(rows: list, root: Path, source: str, split: str, config, section: str):
    """The rows through their loader's columns (any answer kept: the numeric filter is the run's to apply)."""
    from vlrl.data.choose import column_options, loader_name
    from vlrl.data.loaders import GEO3K_FIELDS, MATHVISTA_FIELDS, VIRL39K_FIELDS, load_generic

    fields = {"mathvista": MATHVISTA_FIELDS, "geo3k": GEO3K_FIELDS, "virl39k": VIRL39K_FIELDS, "generic": None}
    chosen = config.data.loader if section == "[data]" and config.data.loader != "auto" else loader_name(source)
    columns = column_options(config.data.columns) if section == "[data]" else {}
    _, report = load_generic(rows, split, fields=fields.get(chosen), numeric_only=False,
                             image_size=config.data.image_size, image_root=root, return_report=True,
                             max_images=config.data.max_images,
                             log=lambda line: None, **columns)
    report.source = source
    return report


def first_rows(source, split: str, n: int) -> tuple[list, Path] | None:
    """The first `n` raw rows of a local source and the directory its image paths are relative to, read without
    loading the rest: a .json / .jsonl file (MathVista's layout, or one's own), a parquet file, a directory holding
    `<split>.jsonl` / `<split>.json`, ViRL39K's table or the hub's `<split>-*.parquet` files. None for any other
    layout.

    >>> rows, root = first_rows("data/mathvista_sample", "testmini", 2)
    >>> len(rows), "question" in rows[0]
    (2, True)
    """
    from vlrl.data.sources import VIRL39K_TABLE

    path = Path(source)
    if path.is_file():
        file, root = path, path.parent
    else:
        named = [path / name for name in (f"{split}.jsonl", f"{split}.json", VIRL39K_TABLE)]
        hub_layout = sorted(p for p in path.rglob("*.parquet") if p.stem == split or p.name.startswith(f"{split}-"))
        file, root = next((p for p in named + hub_layout if p.is_file()), None), path
    rows = _file_head(file, n) if file is not None else None
    return (rows, root.resolve()) if rows is not None else None


def _file_head(path: Path, n: int) -> list | None:
    from itertools import islice

    from vlrl.data.sources import jsonl_records, read_json_text

    if path.suffix == ".jsonl":
        return list(islice(jsonl_records(path), n))  # the run's own reading: a bad line is the same counted skip
    if path.suffix == ".json":
        data = json.loads(read_json_text(path))
        if isinstance(data, dict):  # MathVista's layout: keyed by pid
            return [{"pid": pid, **record} if isinstance(record, dict) else {"__invalid__": f"pid {pid}"}
                    for pid, record in list(data.items())[:n]]
        if isinstance(data, list):
            return data[:n]
        raise ValueError(f"{path} holds a JSON {type(data).__name__}; expected an object keyed by pid or a list")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return batch.to_pylist() if batch is not None else []
    return None  # another format: `vlrl run` reads it through datasets
