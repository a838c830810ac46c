"""Reading a source: a hub id, a local directory or file, a `datasets.Dataset` or a list of dicts -> raw rows.

Raw rows are the source's own columns, not yet checked or converted (`vlrl.data.canonical` does that). A local
directory is either the hub's layout (parquet/arrow data files) or MathVista's own JSON layout: `<split>.json`
keyed by pid (or a list), or `<split>.jsonl`, with image paths relative to the directory. `virl39k_files` finds
ViRL39K's table and pictures (a local copy, or the hub's two files, its images.zip unzipped once into vlrl's cache).

    >>> read_source([{"question": "How many?", "answer": "3", "image": "images/1.png"}], "train", cache_dir=None)
    ([{'question': 'How many?', 'answer': '3', 'image': 'images/1.png'}], None)

A source that cannot be read at all is a `DataError` that says what to do:

    >>> read_source("./no/such/dir", "train", cache_dir=None)
    Traceback (most recent call last):
    ...
    vlrl.base.errors.DataError: './no/such/dir' is neither a directory nor a file; give a local path that exists or ...
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

from vlrl.base.cache import HUB_ID
from vlrl.base.cache import cache_dir as vlrl_cache
from vlrl.base.errors import DataError

VIRL39K_REPO = "TIGER-Lab/ViRL39K"
VIRL39K_TABLE = "39Krelease.parquet"  # beside images.zip in the hub repo; its `image` paths are images/... inside it


def source_name(source) -> str:
    """How a source is named in reports and messages: its path or hub id, else `<its type>`."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return f"<{type(source).__name__}>"


def read_source(source, split: str, cache_dir: str | None):
    """The raw rows of a source and the directory its image paths are relative to (None: not a local source).

    Returns a `datasets.Dataset` (disk-backed when it comes from files, so preprocessing is cached) or a list of
    dicts (in-memory rows, which may mix image forms Arrow cannot hold in one column).

    Raises:
        DataError: the source is of an unknown type, a path that does not exist, or not loadable.
    """
    import datasets

    if isinstance(source, datasets.Dataset):
        return source, None
    if isinstance(source, datasets.DatasetDict):
        if split not in source:
            raise DataError(f"the DatasetDict has no split {split!r}; its splits are {sorted(source)}.")
        return source[split], None
    if isinstance(source, (list, tuple)):
        return list(source), None
    if not isinstance(source, (str, os.PathLike)):
        raise DataError(f"a data source must be a hub id, a path, a datasets.Dataset or a list of dicts, "
                        f"not {type(source).__name__}.")
    path = Path(source)
    if path.is_file():
        if path.suffix in (".json", ".jsonl"):
            return _json_dataset(path, cache_dir), path.parent.resolve()
        return _load_dataset(path.suffix.lstrip("."), split, cache_dir, data_files={split: str(path)}), \
            path.parent.resolve()
    if path.is_dir():
        for candidate in (path / f"{split}.json", path / f"{split}.jsonl"):
            if candidate.is_file():  # MathVista's own layout
                return _json_dataset(candidate, cache_dir), path.resolve()
        splits = sorted({p.stem for p in path.glob("*.json*") if p.suffix in (".json", ".jsonl")})
        if splits and not any(path.rglob("*.parquet")) and not any(path.rglob("*.arrow")):
            raise DataError(f"{path} has no {split}.jsonl or {split}.json; its splits are {', '.join(splits)}: set "
                            f"[data] split (or --split) to one of them.")
        return _load_dataset(str(path), split, cache_dir), path.resolve()
    text = os.fspath(source)
    if not looks_like_hub_id(text):  # a mistyped local path fails here, not after the hub's retries
        raise DataError(f"{text!r} is neither a directory nor a file; give a local path that exists "
                        "or a hub id such as 'AI4Math/MathVista'.")
    return _load_dataset(text, split, cache_dir), None  # a hub id


def looks_like_hub_id(text: str) -> bool:
    """Whether `text` has a hub data set id's shape, `owner/name` (no file suffix, no path prefix): anything else
    that is not on disk is a mistyped local path, refused at once.

    >>> [looks_like_hub_id(t) for t in ("AI4Math/MathVista", "nosuch_dir", "./a/b", "a/b/c", "mine/train.jsonl")]
    [True, False, False, False, False]
    """
    return bool(HUB_ID.fullmatch(text)) and not text.endswith((".json", ".jsonl", ".parquet", ".csv"))


def _load_dataset(path: str, split: str, cache_dir, **kwargs):
    """`datasets.load_dataset`, with its errors turned into a DataError that says what to do."""
    import datasets

    try:
        return datasets.load_dataset(path, split=split, cache_dir=cache_dir, **kwargs)
    except Exception as err:
        local = Path(path).exists()
        hint = ("a local directory must hold <split>.json / <split>.jsonl (MathVista's layout) or data files named "
                f"like {split}-00000-of-00001.parquet (the hub's layout)" if local else
                "a hub id needs network access, or the data set in the datasets cache (HF_DATASETS_CACHE); "
                "offline, download it once elsewhere and pass its local directory")
        raise DataError(f"could not load {path!r} (split {split!r}): {type(err).__name__}: {err}. Note: {hint}.") \
            from err


def _json_dataset(path: Path, cache_dir):
    """MathVista's JSON layout (`<split>.json` keyed by pid, or a list; `<split>.jsonl`) as a cached Dataset.

    Each record is kept as one JSON value, so a record of odd types (an int answer among strings) or a line that
    does not parse becomes one counted skip instead of an Arrow type error that stops the load.
    """
    import datasets

    if path.suffix == ".json":
        read_json_text(path)  # not UTF-8: one line now (inside datasets' generator it would be wrapped in its error)
    if not path.read_bytes().strip():
        raise DataError(f"{path} is empty; a data file holds one JSON record a line (.jsonl) or a list of records "
                        "(.json), each with question, answer and image (docs/data.md).")
    # The cache key covers the JSON file and every file beside it (the images): an edit invalidates the cache.
    stamp = hashlib.sha256()
    for entry in sorted(p for p in path.parent.rglob("*") if p.is_file()):
        info = entry.stat()
        stamp.update(f"{entry.relative_to(path.parent)}:{info.st_size}:{info.st_mtime_ns};".encode())
    try:
        return datasets.Dataset.from_generator(
            _json_records, gen_kwargs={"path": str(path.resolve()), "stamp": stamp.hexdigest()},
            features=datasets.Features({"record": datasets.Json()}), cache_dir=cache_dir)
    except ValueError as err:  # datasets refuses a generator that yields nothing ("corresponds to no data")
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path} holds no records ({err}); give one JSON record a line (.jsonl) or a list of "
                        "records (.json), each with question, answer and image (docs/data.md).") from None


def jsonl_records(path: str | Path):
    """Each non-blank line of a .jsonl file as its record; a line that is not UTF-8 or not JSON as
    `{"__invalid__": why}`, naming the line and the fix, which the canonical schema counts as an `invalid_record`
    skip (one bad line never stops the load)."""
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield {"__invalid__": _not_utf8(raw, number, err)}
                continue
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    yield {"__invalid__": f"line {number}: {err}"}


def non_utf8_lines(path: str | Path) -> list[str]:
    """Each line of a text file that is not UTF-8, named as `jsonl_records` names it (the bytes only are read: cheap
    enough for `vlrl validate` to scan a whole file)."""
    found = []
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                found.append(_not_utf8(raw, number, err))
    return found


def _not_utf8(raw: bytes, number: int, err: UnicodeDecodeError) -> str:
    return f"line {number}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); save the file as UTF-8"


def read_json_text(path: str | Path) -> str:
    """A .json file's text; one that is not UTF-8 is a DataError naming where and the fix."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path} is not UTF-8 (byte 0x{data[err.start]:02x} on line {line}); save it as UTF-8, "
                        "the encoding JSON files are read in.") from None


def _json_records(path: str, stamp: str):
    if path.endswith(".jsonl"):
        for record in jsonl_records(path):
            yield {"record": record}
        return
    text = read_json_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err}); MathVista's layout is one object keyed by pid.") from None
    if isinstance(data, dict):
        for pid, record in data.items():
            yield {"record": {"pid": pid, **record} if isinstance(record, dict) else {"__invalid__": f"pid {pid}"}}
    elif isinstance(data, list):
        for record in data:
            yield {"record": record}
    else:
        raise DataError(f"{path} holds a JSON {type(data).__name__}; expected an object keyed by pid or a list.")


def virl39k_files(source) -> tuple[Path, Path]:
    """ViRL39K's table (39Krelease.parquet) and the directory its `image` paths are relative to.

    A local directory (or its 39Krelease.parquet) is the hub repo as downloaded, with images.zip unzipped in it. A hub
    id downloads the two files through huggingface_hub (its cache, token and HF_HUB_OFFLINE apply) and unzips
    images.zip once into vlrl's cache.

    Raises:
        DataError: no table there, the pictures not unzipped, or the hub not reachable (the message says what to do).
    """
    path = Path(source)
    if path.is_file() or path.is_dir():
        root = (path.parent if path.is_file() else path).resolve()
        table = root / VIRL39K_TABLE
        if not table.is_file():
            raise DataError(f"{root} holds no {VIRL39K_TABLE}; a ViRL39K directory is the hub repo as downloaded: "
                            f"`hf download {VIRL39K_REPO} --repo-type dataset --local-dir {root}`.")
    else:
        table, archive = _hub_files(os.fspath(source))
        root = _unzipped(archive)
    _check_pictures(table, root)
    return table, root


def _hub_files(repo: str) -> tuple[Path, Path]:
    try:
        from huggingface_hub import hf_hub_download

        return tuple(Path(hf_hub_download(repo, name, repo_type="dataset")) for name in (VIRL39K_TABLE, "images.zip"))
    except Exception as err:
        raise DataError(f"could not get {repo} from the hub ({type(err).__name__}: {err}). Offline, download it once "
                        f"where the hub is reachable: `hf download {repo} --repo-type dataset --local-dir ViRL39K`, "
                        "then `unzip images.zip` inside ViRL39K/, copy that directory here and give its path as the "
                        "source.") from err


def _unzipped(archive: Path) -> Path:
    """images.zip extracted once into vlrl's cache, keyed by the archive's blob (a new release extracts anew)."""
    target = vlrl_cache() / "ViRL39K" / archive.resolve().name[:16]
    if not (target / ".complete").exists():  # absent too after an interrupted extraction, which this redoes
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(target)  # zipfile drops absolute paths and '..' from member names
        (target / ".complete").touch()
    return target


def _check_pictures(table: Path, root: Path) -> None:
    """One look, up front, that the pictures are there: a missing images/ is one clear error, not 39K skips."""
    import pyarrow.parquet as pq

    try:
        if "image" not in pq.read_schema(table).names:
            return  # every row is then a counted missing_image, and the load says so
        paths = pq.read_table(table, columns=["image"]).column("image").to_pylist()
    except Exception as err:  # pyarrow's errors for a damaged or truncated file vary
        raise DataError(f"{table} is not a readable parquet file ({type(err).__name__}: {err}); download it "
                        "again.") from err
    listed = (p for value in paths for p in (value if isinstance(value, list) else [value]))
    first = next((p for p in listed if isinstance(p, str) and p), None)
    if first is not None and not (root / first).exists():
        archive = root / "images.zip"
        fix = (f"unzip images.zip in {root} (`cd {root} && unzip images.zip`)" if archive.exists() else
               f"download images.zip from the hub repo {VIRL39K_REPO} into {root} and unzip it there")
        raise DataError(f"ViRL39K's pictures are not in {root} ({first} is missing): {fix}.")
