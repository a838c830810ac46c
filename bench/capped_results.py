"""bench/capped.sh's runs, read back: which presets ran under the hard memory cap, at what peak, and what did not run.

    python bench/capped_results.py                      # reads results/capped_runs.json
    python bench/capped_results.py --engine-pid PID     # gpu_engine.py's process id, for its nvidia-smi peak

Writes results/capped.md and engine.json's `capped_23gib`: per preset `value` (true: its baseline eval batch and two
GSPO steps ran with no out-of-memory error under the cap; false: one came; null: not run), the allocator's peaks
(stages.json, per stage of `vlrl run`), and the process's peak as nvidia-smi saw it (its memory every second, by
process id: the CUDA context and the libraries loaded after the cap included). A run directory joins
results/capped_runs.json as `python bench/results_io.py pack DIR bench/results/capped_runs.json --key NAME`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ('bash bench/capped.sh start 515   # then: bash bench/capped.sh wait 490; and the presets it left: '
           'PLAN=rest bash bench/capped.sh start 560, then PLAN=rest bash bench/capped.sh wait 420 (one H200, carry '
           '[".whl", ".rehearsal"])')
MEASURED, GPU = "2026-11-29", "NVIDIA H200"  # both plans
ENGINE_PID = 4641  # inputs8b's gpu_engine.py process: its results predate their `pid` field
NOT_RUN: dict[str, str] = {}  # presets no plan has run yet, and what is known of them uncapped (none left: 2026-11-29)
NOTES = ("nvidia-smi's process peak is sampled once a second (a shorter peak can pass between samples) and "
         "counts what the cap does not: CUDA libraries and compiled kernels loaded after it. Its logger ended "
         "with the call that started it (capped.sh starts it detached since), so a process that outlived "
         "that call has a lower bound there. `qwen3-vl-8b-thinking-mathvista` ran out of memory in its "
         "baseline eval at an eval batch of 32 (1,536 tokens; kept under `earlier`): its [eval] batch_size "
         "is 16 since (half the eval's KV cache, twice the eval batches), and at 16 it fits.")


def process_peaks(runs: dict) -> dict[int, tuple[float, bool]]:
    """Each process id's peak GiB in nvidia-smi's per-process samples (`pid, MiB` lines), and whether its samples
    cover it to its end: a process still in the file's last samples outlived its logger, so its peak is a lower bound."""
    peaks: dict[int, tuple[float, bool]] = {}
    for name, text in runs.get("nvidia_smi", {}).items():
        samples = [[part.strip() for part in line.split(",")] for line in text.splitlines()] if name.endswith(".csv") else []
        samples = [(int(pid), int(mib) / 1024) for pid, mib in (s for s in samples if len(s) == 2)
                   if pid.isdigit() and mib.isdigit()]
        last = {pid for pid, _ in samples[-12:]}  # the last two seconds' samples (six lanes at most)
        for pid, gib in samples:
            peaks[pid] = (max(peaks.get(pid, (0.0, True))[0], gib), pid not in last)
    return peaks


def preset_row(name: str, run: dict, peaks: dict[int, tuple[float, bool]], cap: float) -> tuple[str, dict]:
    """(preset, its `capped_23gib` entry) from one packed `vlrl run` directory."""
    config = run["config.toml"]
    preset = next(line.split('"')[1] for line in config.splitlines() if line.startswith("name"))
    stages = run["stages.json"]
    most = max(s.get("peak_reserved_gib") or 0 for s in stages["stages"])  # the first stage within 0.05 GiB of it:
    top = next(s for s in stages["stages"] if (s.get("peak_reserved_gib") or 0) >= most - 0.05)  # reserved stays
    oom = "out of GPU memory" in run["run.log"]
    steps = [r for r in run.get("train_log.jsonl", []) if "step_time" in r]
    peak, whole = peaks.get(stages.get("pid"), (0.0, False))
    return preset, {
        "value": not oom and len(steps) == 2, "cap_gib": cap,
        "max_reserved_gib": top["peak_reserved_gib"],
        "max_allocated_gib": max(s.get("peak_allocated_gib") or 0 for s in stages["stages"]),
        "stage_at_peak": top["stage"], "process_peak_gib": round(peak, 2) or None, "process_peak_whole": whole,
        "gspo_steps": len(steps), "out_of_memory": oom, "raw": f"capped_runs.json#{name}",
    }


def engine_rows(runs: dict, peaks: dict[int, tuple[float, bool]], pid: int | None) -> list[dict]:
    """The 8B preset path by input under its own cap (gpu_engine.py --memory-cap-gib)."""
    rows = []
    for name, result in sorted(runs.get("inputs8b", {}).items()):
        if name.endswith(".json"):
            rows.append({"input": result["input"].replace("-", " "), "cap_gib": result["memory_cap_gib"],
                         "max_reserved_gib": round(result["max_reserved_gib"], 2),
                         "max_allocated_gib": round(result["max_allocated_gib"], 2),
                         "process_peak_gib": round(peaks.get(result.get("pid", pid), (0.0, False))[0], 2) or None,
                         "step_s_shared_gpu": round(result["step_s"], 1), "raw": f"capped_runs.json#inputs8b/{name}"})
    return rows


def smi_peak(row: dict) -> str:
    """nvidia-smi's process peak as the page shows it: a lower bound where the logger stopped before the process."""
    if not row["process_peak_gib"]:
        return "not sampled (its logger had stopped)"
    return f"{row['process_peak_gib']}" + ("" if row["process_peak_whole"] else " at least (its logger stopped first)")


def page(capped: dict) -> str:
    lines = ["# Every GPU preset under a hard memory cap (issue 50 point 5)", "",
             f"    {capped['command']}", "", capped["how"], "",
             "| preset | under 23 GiB? | allocator peak reserved / allocated GiB | where | nvidia-smi process peak GiB |",
             "|---|---|---|---|---|"]
    for preset, row in capped["presets"].items():
        if row["value"] is None:
            lines.append(f"| `{preset}` | not run | | {row['note']} | |")
            continue
        verdict = "**yes**" if row["value"] else "**no: out of memory**"
        lines.append(f"| `{preset}` | {verdict} | {row['max_reserved_gib']} / {row['max_allocated_gib']} | "
                     f"{row['stage_at_peak']} | {smi_peak(row)} |")
    lines += ["", "The 8B preset path by input at 1,024 tokens (`bench/gpu_engine.py --memory-cap-gib 22`, issue 48):", "",
              "| input | cap GiB | peak reserved / allocated GiB | nvidia-smi process peak GiB |", "|---|---|---|---|"]
    lines += [f"| {r['input']} | {r['cap_gib']:g} | {r['max_reserved_gib']} / {r['max_allocated_gib']} | "
              f"{r['process_peak_gib']} |" for r in capped["inputs"]]
    return "\n".join(lines + ["", capped["notes"], ""])


def capped(runs: dict, cap: float = 23.0, engine_pid: int | None = ENGINE_PID) -> dict:
    """engine.json's `capped_23gib` from capped_runs.json's packed runs: each preset's entry (a later run of a preset,
    e.g. at a smaller default, after an earlier one kept under `earlier`), the 8B path by input, and how they ran."""
    peaks = process_peaks(runs)
    presets = {}
    for name, run in sorted(runs.items()):
        if "config.toml" in run:
            preset, row = preset_row(name, run, peaks, cap)
            presets[preset] = {**row, "earlier": presets[preset]} if preset in presets else row
    presets.update({preset: {"value": None, "note": note} for preset, note in NOT_RUN.items() if preset not in presets})
    context = runs["nvidia_smi"]["context_gib.txt"].strip()
    return {
        "command": COMMAND, "measured": MEASURED, "gpu": GPU, "presets": dict(sorted(presets.items())),
        "inputs": engine_rows(runs, peaks, engine_pid),
        "how": (f"One H200, {MEASURED}, in two plans (the first, then PLAN=rest on a fresh machine), lanes at once "
                f"(five GPU processes at most): each preset through `vlrl run` as a user starts it "
                f"(random weights of the real config, bench/rehearsal.sh's data and reward) with "
                f"`--set model.memory_cap_gib={cap:g}`: its baseline eval (one batch at the preset's eval batch "
                f"size), then two GSPO steps at its shape (the Crafter presets: each step one generation batch of "
                f"episodes); the eval after training left out. The lanes share the GPU, so each process's cap counts "
                f"its own CUDA context ({context} GiB, measured alone) and not the other lanes' memory: its allocator "
                f"may reserve {cap - float(context):.2f} GiB. Step times here are not speeds (up to five processes "
                f"shared the GPU)."),
        "notes": NOTES,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default=str(RESULTS / "capped_runs.json"))
    p.add_argument("--engine-pid", type=int, default=ENGINE_PID, help="gpu_engine.py's process id, where its results lack one")
    p.add_argument("--cap", type=float, default=23.0)
    args = p.parse_args()
    found = capped(json.loads(Path(args.runs).read_text()), args.cap, args.engine_pid)
    (RESULTS / "capped.md").write_text(page(found))
    engine = json.loads((RESULTS / "engine.json").read_text())
    engine["capped_23gib"] = found
    (RESULTS / "engine.json").write_text(json.dumps(engine, indent=2, ensure_ascii=False) + "\n")
    print(page(found))


if __name__ == "__main__":
    main()
