"""Export sizes and times: every format `vlrl export` writes, from one tiny run, with the checks each one passed.

    VLRL_CACHE=/work/cache python bench/bench_export.py                  # a fresh `vlrl run --preset tiny` first
    python bench/bench_export.py --run-dir runs/demo --gguf-types f16

Times are wall-clock seconds of the whole export, verification included (the verification is most of it: loading
the base, reading files back, llama.cpp's runs). Writes bench/results/export.json and export.md. merged4 needs CUDA
and is left out on a CPU machine (said so in the results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_results  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a finished run (default: run the tiny preset into a temporary folder)")
    parser.add_argument("--gguf-types", nargs="+", default=["f32", "f16", "bf16", "q8_0"])
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "export"))
    args = parser.parse_args()

    import torch

    from vlrl import export
    from vlrl.cli import main as vlrl

    def quiet(*_):
        pass

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_dir = Path(args.run_dir) if args.run_dir else tmp / "run"
        run_seconds = None
        if not args.run_dir:
            started = time.perf_counter()
            assert vlrl(["run", "--preset", "tiny", "--run-dir", str(run_dir)]) == 0
            run_seconds = round(time.perf_counter() - started, 1)
        adapter = run_dir / "adapter"
        export.llama_cpp_tools()  # a one-time fetch is not an export's time
        rows = []

        def timed(fmt, call):
            started = time.perf_counter()
            result = call()
            rows.append({"format": fmt, **result, "wall_seconds": round(time.perf_counter() - started, 1)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "files"}), flush=True)

        timed("lora", lambda: export.export_run(run_dir, "lora", output_dir=tmp / "lora", log=quiet))
        timed("merged fp32", lambda: export.export_merged(adapter, tmp / "merged32", dtype="fp32", log=quiet))
        timed("merged16", lambda: export.export_run(run_dir, "merged16", output_dir=tmp / "merged16", log=quiet))
        if torch.cuda.is_available():
            timed("merged4", lambda: export.export_run(run_dir, "merged4", output_dir=tmp / "merged4", log=quiet))
        for outtype in args.gguf_types:
            timed(f"gguf {outtype}", lambda t=outtype: export.export_gguf(adapter, tmp / f"gguf-{t}", outtype=t,
                                                                          log=quiet))
    load_after = os.getloadavg()
    result = {
        "what": "vlrl export of the tiny preset's trained adapter: every format, verified",
        "command": " ".join(["VLRL_CACHE=/work/cache python bench/bench_export.py", *sys.argv[1:]]),
        "run_seconds": run_seconds, "exports": rows,
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "cuda": torch.cuda.is_available(), "llama_cpp_python": export.llama_cpp_version(),
                    "load_average_1_5_15_before": [round(x, 2) for x in load_before],
                    "load_average_1_5_15_after": [round(x, 2) for x in load_after]},
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_results(result, args.output, markdown)


def size(row: dict) -> str:
    if isinstance(row.get("bytes"), dict):
        return " + ".join(f"{kind} {n / 1e6:.2f} MB" for kind, n in row["bytes"].items())
    return f"{row['bytes'] / 1e6:.2f} MB"


def check(row: dict) -> str:
    if row["format"] == "lora":
        return (f"read-back gap {row['reload_gap']:.1e} (tol {1e-5:.0e}); {row['nonzero_lora_B']}/"
                f"{row['lora_B_tensors']} lora_B non-zero; base vs base + adapter {row['adapter_effect']:.2f}")
    if row["format"].startswith("merged"):
        extra = f"; read back vs quantized {row['quantized_reload_gap']:.1e}" if "quantized_reload_gap" in row else ""
        return (f"vs base + adapter {row['logits_gap']:.1e} (tol {row['tolerance']:.0e}){extra}; "
                f"{row['vision_tensors_unchanged']} vision tensors equal the base's")
    return (f"llama.cpp vs HF: merged {row['merged_gap']:.1e}, base + adapter GGUF {row['adapter_gap']:.1e} "
            f"(tol {row['tolerance']:.0e}; base alone {row['base_without_adapter_gap']:.2f}); mmproj image "
            f"embeddings {row['mmproj_gap']:.1e} (tol {row['mmproj_tolerance']:.0e}); tensors read back "
            f"{row['gguf_tensors_checked']}")


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# Export sizes and times ({r['date']})", "", f"`{r['command']}`", "",
             f"{r['what']}. {m['cpus']} CPUs, CUDA {m['cuda']}, torch {m['torch']}, llama-cpp-python "
             f"{m['llama_cpp_python']}." + (f" The tiny run itself took {r['run_seconds']} s." if r["run_seconds"]
                                            else ""), "",
             "| format | seconds (verification included) | size | checks passed |", "|---|---|---|---|"]
    lines += [f"| {row['format']} | {row['wall_seconds']} | {size(row)} | {check(row)} |" for row in r["exports"]]
    gguf = [row for row in r["exports"] if row["format"].startswith("gguf")]
    if gguf:
        steps = ", ".join(f"{k} {v} s" for k, v in gguf[0]["seconds"].items())
        lines += ["", (f"Where a GGUF export's time goes ({gguf[0]['format']}): {steps}. Each converter is a fresh "
                       "Python process (torch + transformers imports); reading the model GGUF back with gguf-py's "
                       "GGUFReader parses the 151,936-token vocabulary.")]
    if not m["cuda"]:
        lines += ["", "merged4 (bitsandbytes NF4) needs CUDA: not measured on this CPU machine."]
    lines += ["", (f"Load average (1/5/15 min) before: {m['load_average_1_5_15_before']}, after: "
                   f"{m['load_average_1_5_15_after']}. The CPU is shared, so the seconds move with the load."), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
