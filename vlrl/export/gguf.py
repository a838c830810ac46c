"""GGUF files for llama.cpp, written by llama.cpp's own converters (fetched here) and then verified.

    export_gguf("runs/demo/adapter", "runs/demo/gguf", outtype="f16")

Writes model-<type>.gguf (text) + mmproj-<type>.gguf (vision) from the merged model, and adapter-<type>.gguf (a
llama.cpp LoRA adapter for the base model's GGUF). The files are then read back with gguf-py
(`vlrl.export.gguf_structure`: architecture, hyperparameters, every tensor name and shape) and run by llama.cpp
itself (`vlrl.export.llama_check`: logits and image embeddings against the HF merged model's).

PyPI's `gguf` package lags behind llama.cpp's converter, so vlrl runs the converter and gguf-py that the
installed llama-cpp-python's source release bundles (`llama_cpp_tools`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vlrl.base.cache import cache_dir as default_cache
from vlrl.base.errors import ConfigError, ExportError
from vlrl.export.adapter import adapter_config, verify_adapter
from vlrl.export.gguf_structure import check_gguf_structure
from vlrl.export.llama_check import check_with_llama_cpp, require_llama_cpp
from vlrl.export.merged import disk_size, export_merged

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")  # k-quants need rows of 256: not for 64-wide tiny tensors
LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python release whose bundled llama.cpp converters vlrl runs


def export_gguf(adapter_dir: str | Path, output_dir: str | Path, *, outtype: str = "f16",
                base: str | Path | None = None, name: str | None = None, log=print) -> dict:
    """Writes model-<outtype>.gguf + mmproj-<outtype>.gguf (the merged model: text + vision) and
    adapter-<outtype>.gguf (a llama.cpp LoRA adapter for the base model's GGUF), then verifies them with llama.cpp.

    Checks: the GGUF reader finds the architecture (qwen3vl / clip with the qwen3vl_merger projector / a LoRA
    adapter), and every tensor name and shape the HF checkpoints imply. llama.cpp tokenizes the text probe as HF
    does, and its logits on it, from the merged GGUF and from the base GGUF with the adapter GGUF, are within
    `TOLERANCE["gguf-<outtype>"]` of the HF merged model's (the base GGUF alone must not be). The mmproj loads in
    llama.cpp's multimodal library, and its embeddings of the probe image (with the deepstack features) are within
    `TOLERANCE["mmproj"]` (or the GGUF type's, if larger) of the HF vision tower's.

    Args:
        adapter_dir: the saved adapter.
        output_dir: the folder for the three files (created).
        outtype: "f32", "f16", "bf16" or "q8_0".
        base: the base checkpoint (a local folder or a hub id in the local cache); default: the adapter's.
        name: the model name written into the GGUF metadata.

    Returns:
        the files with their sizes, the structural checks, the logit gaps, and the seconds each step took.
    """
    if outtype not in GGUF_TYPES:
        raise ConfigError(f"outtype {outtype!r}: choose one of {', '.join(GGUF_TYPES)}.")
    started = time.time()
    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    verify_adapter(adapter_dir)
    base_dir = _local_checkpoint(base or adapter_config(adapter_dir)["base_model_name_or_path"])
    require_verified_family(base_dir)
    llama_cpp = require_llama_cpp()
    tools = llama_cpp_tools(log=log)
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {kind: output_dir / f"{kind}-{outtype}.gguf" for kind in ("model", "mmproj", "adapter")}
    seconds = {}
    with tempfile.TemporaryDirectory(dir=output_dir) as tmp:
        tmp = Path(tmp)
        # Merge in the base's own precision (float32 for the tiny model), or bf16, so GGUF gets the merged numbers.
        merge_dtype = "fp32" if outtype == "f32" or _checkpoint_dtype(base_dir) == "float32" else "bf16"
        t = time.time()
        export_merged(adapter_dir, tmp / "merged", dtype=merge_dtype, base=base_dir, log=log)
        seconds["merge"] = time.time() - t
        base_gguf = tmp / f"base-{outtype}.gguf"
        extra = ["--model-name", name] if name else []
        for kind, script, args in (
                ("model", "convert_hf_to_gguf.py", [tmp / "merged", *extra]),
                ("mmproj", "convert_hf_to_gguf.py", [tmp / "merged", "--mmproj", *extra]),
                ("adapter", "convert_lora_to_gguf.py", [adapter_dir, "--base", base_dir]),
                ("base (for the adapter check)", "convert_hf_to_gguf.py", [base_dir])):
            t = time.time()
            _convert(tools, script, args, files.get(kind, base_gguf), outtype)
            seconds[f"convert {kind}"] = time.time() - t
        t = time.time()
        structure = check_gguf_structure(files, tmp / "merged", adapter_dir, tools)
        seconds["read back"] = time.time() - t
        t = time.time()
        numbers = check_with_llama_cpp(llama_cpp, files, base_gguf, tmp / "merged", outtype,
                                       adapter_dir=adapter_dir, base_dir=base_dir)
        seconds["llama.cpp checks"] = time.time() - t
    result = {"files": {k: str(v) for k, v in files.items()}, "bytes": {k: disk_size(v) for k, v in files.items()},
              "outtype": outtype, **structure, **numbers,
              "seconds": {k: round(v, 2) for k, v in seconds.items()} | {"total": round(time.time() - started, 2)}}
    log(f"gguf ({outtype}): llama.cpp logit gaps {numbers['merged_gap']:.1e} (merged) and "
        f"{numbers['adapter_gap']:.1e} (base + adapter) vs HF, tolerance {numbers['tolerance']:.0e}; "
        f"mmproj image embeddings gap {numbers['mmproj_gap']:.1e} -> {output_dir}")
    return result


# --- llama.cpp's converters -----------------------------------------------------------------------------------


def llama_cpp_tools(cache_dir: str | Path | None = None, *, log=print) -> Path:
    """The folder holding llama.cpp's converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py, conversion/,
    gguf-py/), from the same llama.cpp that the installed llama-cpp-python runs.

    In order: `$VLRL_LLAMA_CPP` (a llama.cpp checkout), the cache (`$VLRL_CACHE/llama.cpp-<version>`), else
    `pip download` of the llama-cpp-python source release, of which only those files (MIT licensed, about 2 MB)
    are kept.

    Raises:
        ExportError: `$VLRL_LLAMA_CPP` holds no converter, or the source release cannot be downloaded.
    """
    if os.environ.get("VLRL_LLAMA_CPP"):
        folder = Path(os.environ["VLRL_LLAMA_CPP"])
        if not (folder / "convert_hf_to_gguf.py").exists():
            raise ExportError(f"VLRL_LLAMA_CPP={folder} holds no convert_hf_to_gguf.py; point it at a llama.cpp "
                              "checkout, or unset it to let vlrl fetch the converters.")
        return folder
    version = llama_cpp_version()
    folder = Path(cache_dir or default_cache()) / f"llama.cpp-{version}"
    if (folder / "convert_lora_to_gguf.py").exists():
        return folder
    log(f"fetching llama.cpp's converters from the llama-cpp-python {version} source release -> {folder}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={version}", "--dest", tmp],
            capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode or not archives:
            raise ExportError(f"could not download llama-cpp-python {version}'s source release to get llama.cpp's "
                              f"converters:\n{done.stderr[-2000:]}\nWith no network, set VLRL_LLAMA_CPP to a "
                              "llama.cpp checkout.")
        staging = Path(tmp) / "llama.cpp"
        _extract_converters(archives[0], staging)
        try:
            staging.rename(folder)
        except OSError:  # another process finished first: keep its copy
            if not (folder / "convert_lora_to_gguf.py").exists():
                raise
    return folder


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version (so the converters match the runtime), else the pinned one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return LLAMA_CPP_PYTHON


def _extract_converters(archive: Path, target: Path) -> None:
    import tarfile

    keep = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "LICENSE", "conversion/", "gguf-py/gguf/",
            "gguf-py/LICENSE")
    # tarfile's "data" filter exists from Python 3.11.4 / 3.12 (Debian 12's python3 is 3.11.2): without it, only
    # plain files and folders are extracted, and no name may climb out of `target`.
    safety = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            _, sep, inner = member.name.partition("/vendor/llama.cpp/")
            if not sep or not inner.startswith(keep) or not (member.isfile() or member.isdir()):
                continue
            if inner.startswith("/") or ".." in Path(inner).parts:
                raise ExportError(f"{archive.name} holds a path that leaves its folder ({member.name}); not extracted.")
            member.name = inner
            tar.extract(member, target, **safety)
    if not (target / "convert_hf_to_gguf.py").exists():
        raise ExportError(f"{archive.name} holds no vendor/llama.cpp/convert_hf_to_gguf.py.")


def _convert(tools: Path, script: str, args: list, outfile: Path, outtype: str) -> None:
    """Runs one of llama.cpp's converters in a subprocess (it brings its own gguf-py); raises ExportError."""
    command = [sys.executable, str(tools / script), *map(str, args), "--outfile", str(outfile), "--outtype", outtype]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode or not Path(outfile).exists():
        raise ExportError(f"llama.cpp's {script} failed (exit {done.returncode}):\n{done.stderr[-3000:]}\n"
                          f"command: {' '.join(command)}")


def _local_checkpoint(name_or_path: str | Path) -> Path:
    """A local folder for the converter: the path itself, or the hub id's snapshot in the local HF cache."""
    path = Path(name_or_path)
    if (path / "config.json").exists():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path)))
    except Exception as err:  # offline and not cached, or not a hub id
        raise ExportError(f"the base checkpoint {name_or_path} is neither a local folder nor a downloadable hub id "
                          f"({err}); pass base= (--base) with the base model's folder.") from err


# The families whose GGUF files vlrl can verify (gguf_structure's tensor names, llama_check's logits and image
# embeddings). llama.cpp's converter of llama-cpp-python 0.3.36 also writes Qwen3.5 (QWEN35, QWEN35MOE, with the
# qwen3vl projector; `--no-mtp`, since transformers saves no multi-token-prediction layers): on the random tiny Qwen3.5
# at f32, llama.cpp's logits were 3.6e-7 from HF's (checked by hand, issue 36). But the verification knows Qwen3-VL's
# tensor layout only (deepstack, no linear-attention tensors), and an unverified file is never written under a run.
GGUF_VERIFIED_FAMILIES = ("qwen3_vl",)


def require_verified_family(base_dir: str | Path) -> None:
    """ExportError in one line unless the base checkpoint's family is one whose GGUF files vlrl verifies."""
    family = json.loads((Path(base_dir) / "config.json").read_text()).get("model_type")
    if family not in GGUF_VERIFIED_FAMILIES:
        raise ExportError(f"gguf export is not available for {family} yet: llama.cpp's converter supports it, but "
                          f"vlrl verifies GGUF files of {', '.join(GGUF_VERIFIED_FAMILIES)} only; export merged16 and "
                          "run llama.cpp's convert_hf_to_gguf.py --no-mtp on merged16/ yourself (docs/export.md).")


def _checkpoint_dtype(folder: Path) -> str | None:
    config = json.loads((Path(folder) / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
