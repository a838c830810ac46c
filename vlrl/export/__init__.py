"""Export what a run trained: the LoRA adapter, a merged checkpoint, and GGUF files for llama.cpp — each verified.

    vlrl export --run-dir runs/demo --format lora | merged16 | merged4 | gguf
    export_run("runs/demo", "gguf", outtype="f16")

This package's front door: `export_run` (one format of a run directory's adapter, its checks recorded in the run's
export.json) and the public names of the modules that do the work, one job each:

| module | job |
|---|---|
| `probe` | the fixed probe (image + question), its logits, `logits_gap`, and `TOLERANCE` for each export |
| `adapter` | `lora` -> adapter/: save, lora_B non-zero and finite, the adapter read back from disk; `load_adapted` |
| `card` | the adapter's model card (README.md), from adapter_config.json and the run's config and comparison |
| `merged` | `merged16` / `merged4`: base + adapter folded into one checkpoint, logits and untouched tensors checked |
| `gguf` | `gguf`: llama.cpp's converters (fetched once), model + mmproj + adapter GGUF files |
| `gguf_structure` | the GGUF files read back with gguf-py: architecture, hyperparameters, tensor names and shapes |
| `llama_check` | llama.cpp runs the GGUF files: logits and the mmproj's image embeddings vs HF's |

Every export is read back from disk and checked against the model it came from, so a file that exists is a file
that works; docs/export.md lists each check with the gap measured on the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlrl.base.errors import ConfigError, ExportError
from vlrl.config.rundir import RunDir
from vlrl.config.runfile import EXPORT_FORMATS
from vlrl.export.adapter import (
    adapter_config,
    check_reload,
    check_saved,
    export_adapter,
    load_adapted,
    lora_b_stats,
    reload_tolerance,
    verify_adapter,
)
from vlrl.export.card import write_model_card
from vlrl.export.gguf import GGUF_TYPES, LLAMA_CPP_PYTHON, export_gguf, llama_cpp_tools, llama_cpp_version
from vlrl.export.gguf_structure import check_gguf_structure, gguf_name
from vlrl.export.merged import MERGED_DTYPES, export_merged
from vlrl.export.probe import PROBE_QUESTION, TOLERANCE, logits_gap, probe_image, probe_inputs, probe_logits

__all__ = [
    "EXPORT_FORMATS", "GGUF_TYPES", "LLAMA_CPP_PYTHON", "MERGED_DTYPES", "PROBE_QUESTION", "TOLERANCE", "ExportError",
    "adapter_config", "check_gguf_structure", "check_reload", "check_saved", "export_adapter", "export_gguf",
    "export_merged", "export_run", "gguf_name", "llama_cpp_tools", "llama_cpp_version", "load_adapted", "logits_gap", "lora_b_stats",
    "probe_image", "probe_inputs", "probe_logits", "reload_tolerance", "verify_adapter", "write_model_card",
]


def export_run(run_dir: str | Path, fmt: str, *, output_dir: str | Path | None = None,
               base: str | Path | None = None, outtype: str = "f16", log=print) -> dict:
    """Exports a finished run's adapter as `fmt` and records the checks in the run's export.json.

    Args:
        run_dir: a run directory whose training finished (it holds adapter/).
        fmt: one of `EXPORT_FORMATS`: lora, merged16, merged4 or gguf.
        output_dir: default: the run's folder for the format (`RunDir.export_dir`: adapter/, merged16/, merged4/,
            gguf/).
        base: the base checkpoint (see `load_adapted`).
        outtype: the GGUF weight type, one of `GGUF_TYPES` (gguf only).

    Returns:
        The export's checks, as `export_adapter`, `export_merged` or `export_gguf` return them.

    Raises:
        ValueError: an unknown format. ExportError: no such run, no adapter, an untrained adapter, or an export
        that fails its verification.
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise ExportError(f"no run directory at {run.path}; give the --run-dir of a finished `vlrl run`.")
    if not (run.adapter / "adapter_config.json").exists():
        raise ExportError(f"{run.path} holds no adapter (adapter/adapter_config.json): the run has not finished "
                          "training. Finish it with `vlrl run` first.")
    verify_adapter(run.adapter)  # an untrained adapter stops here, before any model loads
    output_dir = Path(output_dir or run.export_dir(fmt))
    if fmt == "lora":
        model, processor = load_adapted(run.adapter, base=base)
        result = export_adapter(model, processor, output_dir, run_dir=run.path, log=log)
    elif fmt in ("merged16", "merged4"):
        result = export_merged(run.adapter, output_dir, dtype="bf16" if fmt == "merged16" else "4bit", base=base,
                               log=log)
    else:
        result = export_gguf(run.adapter, output_dir, outtype=outtype, base=base, name=run.name, log=log)
    exports = json.loads(run.export_record.read_text()) if run.export_record.exists() else {}
    exports[fmt] = {"path": str(output_dir), **result}
    run.export_record.write_text(json.dumps(exports, indent=2))
    return result
