"""Benchmark: completions scored per second by vlrl's rewards on 10k realistic completions (CPU, one process).

    python bench/bench_rewards.py                       # writes bench/results/rewards.json and rewards.md
    python bench/bench_rewards.py --n 2000 --repeats 3  # quicker

The completions imitate what a Qwen3-VL policy writes during GSPO on MathVista: a REASONING block of a few
hundred to ~3000 characters and a SOLUTION (right, wrong, or written differently: "3.0", "1,250", "B",
"12 cm"), plus the failure modes the format reward exists for: missing or doubled tags, truncation, `<think>`
blocks and `addCriterion` spam. Items mix MathVista's answer types (integer, float with precision,
multi-choice, units). Also measured: the same batch in TRL's conversational form, the symbolic (math-verify)
reward on geometry answers, and time per character on adversarial inputs of growing size (flat means linear).
Wall time and CPU time are both reported: on a shared machine, CPU time is the steadier of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.grammar import rewards
from vlrl.grammar import symbolic as symbolic_module  # after the path insert: bench this checkout

WORDS = ("the bar for", "is taller than", "so the value is", "reading the axis", "gives", "which means",
         "the angle", "measures", "the area of the rectangle", "equals", "we count", "circles", "in total",
         "subtracting", "from", "the legend shows", "the largest", "adding up", "therefore", "let me check")
GEOMETRY = {  # gold -> how a policy writes it (right and wrong), for the symbolic reward
    "2\\sqrt{3}": ["\\sqrt{12}", "2\\sqrt{3}", "3.46"], "\\frac{4}{3}": ["4/3", "1.33", "\\frac{8}{6}"],
    "4\\sqrt{2}": ["\\sqrt{32}", "5.66"], "\\frac{\\sqrt{3}}{2}": ["\\frac{1}{2}\\sqrt{3}", "0.87"],
    "12": ["12", "12.0"], "6\\pi": ["6\\pi", "18.85"], "\\frac{16}{3}": ["5\\frac{1}{3}", "16/3"],
}


def reasoning(rng: random.Random) -> str:
    words = [rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randint(0, 500))
             for _ in range(rng.randint(20, 300))]
    return " ".join(words).replace(" therefore", ".\ntherefore")  # a few newlines, as real reasoning has


def item(rng: random.Random) -> dict:
    kind = rng.choice(["integer", "integer", "float", "multi_choice", "unit"])
    if kind == "integer":
        n = rng.randint(0, 3000)
        return {"answer": str(n), "meta": {"answer_type": "integer", "question_type": "free_form"},
                "right": [str(n), f"{n}.0", f"{n:,}"], "wrong": [str(n + rng.randint(1, 9)), f"{n}.5"]}
    if kind == "float":
        p = rng.choice([1, 2])
        x = round(rng.uniform(0, 100), p)
        meta = {"answer_type": "float", "precision": p, "question_type": "free_form"}
        return {"answer": str(x), "meta": meta,
                "right": [str(x), f"{x:.{p + 2}f}"], "wrong": [str(round(x + 0.5, p))]}
    if kind == "multi_choice":
        choices = rng.sample(["145°", "135°", "130°", "120°", "Yes", "No", "larger", "smaller", "7", "12"], 4)
        i = rng.randrange(4)
        letter = "ABCD"[i]
        return {"answer": choices[i],
                "meta": {"question_type": "multi_choice", "choices": choices, "answer_type": "text"},
                "right": [letter, f"({letter})", choices[i], f"({letter}) {choices[i]}"],
                "wrong": ["ABCD"[(i + 1) % 4], choices[(i + 1) % 4]]}
    n = rng.randint(1, 99)
    return {"answer": str(n), "meta": {"unit": "cm", "answer_type": "integer", "question_type": "free_form"},
            "right": [f"{n} cm", str(n)], "wrong": [f"{n + 1} cm", f"{n} m"]}


def completion(rng: random.Random, it: dict) -> str:
    solution = rng.choice(it["right"] if rng.random() < 0.45 else it["wrong"])
    body = f"<REASONING>{reasoning(rng)}</REASONING>\n<SOLUTION>{solution}</SOLUTION>"
    r = rng.random()
    if r < 0.55:
        return body
    if r < 0.65:
        return f"<think>{reasoning(rng)}</think>\n{body}"  # a -Thinking checkpoint
    if r < 0.75:
        return f"{reasoning(rng)} The answer is {solution}."  # no tags
    if r < 0.82:
        return f"<REASONING>{reasoning(rng)}"  # truncated at the completion budget
    if r < 0.88:
        return body + f"<SOLUTION>{rng.choice(it['wrong'])}</SOLUTION>"  # two answers
    if r < 0.905:
        return "addCriterion\n" * rng.randint(50, 400)  # the Qwen-VL collapse
    if r < 0.93:
        return body + "addCriterion\n" * rng.randint(100, 400)  # collapse after answering
    return f"<SOLUTION>{solution}</SOLUTION>"  # answer only


def batch(n: int, seed: int) -> tuple[list[str], list[str], dict]:
    rng = random.Random(seed)
    items = [item(rng) for _ in range(n)]
    completions = [completion(rng, it) for it in items]
    columns = {k: [it["meta"].get(k) for it in items] for k in rewards.META_COLUMNS}
    return completions, [it["answer"] for it in items], columns


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `repeats` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def in_steps(func, completions, answers, columns, step: int = 32):
    # TRL scores one generation batch per call; 32 = batch 8 x 4 generations, the GSPO preset.
    out = []
    for s in range(0, len(completions), step):
        cols = {k: v[s:s + step] for k, v in columns.items()}
        out += func(completions[s:s + step], answer=answers[s:s + step], **cols)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="completions in the batch")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rewards"))
    args = parser.parse_args()

    completions, answers, columns = batch(args.n, seed=0)
    conversational = [[{"role": "assistant", "content": c}] for c in completions]
    chars = sum(len(c) for c in completions)
    results = {"n_completions": args.n, "mean_chars": round(chars / args.n), "repeats": args.repeats,
               "runs": {}}

    def record(name, seconds, n):
        wall, cpu = seconds
        results["runs"][name] = {"n": n, "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
                                 "per_s_wall": round(n / wall), "per_s_cpu": round(n / cpu)}
        print(f"{name:44s} wall {wall:8.3f} s cpu {cpu:8.3f} s  {n / cpu:9.0f} completions per CPU-second",
              flush=True)

    def fmt(batch=completions):
        return rewards.format_reward(batch)

    def cor(batch=completions):
        return in_steps(rewards.correctness_reward, batch, answers, columns)

    record("format_reward", timed(fmt, args.repeats), args.n)
    record("correctness_reward (calls of 32)", timed(cor, args.repeats), args.n)
    record("both rewards (a training step's work)", timed(lambda: (fmt(), cor()), args.repeats), args.n)
    record("both rewards, TRL conversational form",
           timed(lambda: (fmt(conversational), cor(conversational)), args.repeats), args.n)

    formats, scores = fmt(), cor()
    results["score_mix"] = {
        "format": {str(k): formats.count(k) for k in sorted(set(formats))},
        "correctness": {str(k): scores.count(k) for k in (2.0, 1.5, 0.0)},
    }

    # Symbolic (math-verify) on geometry answers: sympy parses each distinct text once and verifies each
    # distinct (prediction, gold) pair once, both cached: a cold cache is a first epoch, a warm one the next.
    rng = random.Random(1)
    n_geo = min(args.n, 2000)
    geo_gold = [rng.choice(list(GEOMETRY)) for _ in range(n_geo)]
    geo = [f"<REASONING>{reasoning(rng)}</REASONING><SOLUTION>{rng.choice(GEOMETRY[g])}</SOLUTION>"
           for g in geo_gold]
    symbolic_module._parse_math.cache_clear()
    symbolic_module.equivalent.cache_clear()
    record("symbolic_correctness_reward, cold cache",
           timed(lambda: rewards.symbolic_correctness_reward(geo, geo_gold), 1), n_geo)
    record("symbolic_correctness_reward, warm cache",
           timed(lambda: rewards.symbolic_correctness_reward(geo, geo_gold), args.repeats), n_geo)

    # Linear time: CPU microseconds per 1000 characters on adversarial text of growing size.
    results["adversarial_cpu_us_per_kchar"] = {}
    for pattern in ("<SOLUTION>", "</SOLUTION>", "<think>", "addCriterion\n"):
        row = {}
        for reps in (10_000, 40_000, 160_000):
            text = [pattern * reps]
            _, cpu = timed(lambda t=text: (rewards.format_reward(t), rewards.correctness_reward(t, ["3"])), 3)
            row[f"x{reps}"] = round(cpu / len(text[0]) * 1e9, 2)
        results["adversarial_cpu_us_per_kchar"][pattern] = row
        print(f"adversarial {pattern!r}: CPU microseconds per 1000 characters, by repetitions: {row}")

    results["machine"] = {"python": platform.python_version(), "platform": platform.platform(),
                          "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    results["command"] = " ".join(["python bench/bench_rewards.py", *sys.argv[1:]])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [
        "# Reward scoring speed",
        "",
        f"Command: `{r['command']}` (from the repository root).",
        "",
        (f"{m['platform']}, Python {m['python']}, {m['cpus']} CPUs, load average {m['load_average']} (a "
         f"shared machine: CPU time is the steadier figure), one process. {r['n_completions']} completions "
         f"of {r['mean_chars']} characters on average; median of {r['repeats']} runs."),
        "",
        "| what | completions | wall s | CPU s | completions / s (wall) | completions / CPU-s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {name} | {v['n']} | {v['wall_s']} | {v['cpu_s']} | {v['per_s_wall']:,} | "
              f"{v['per_s_cpu']:,} |" for name, v in r["runs"].items()]
    mix = r["score_mix"]
    lines += ["", f"Score mix of the batch: format {mix['format']}, correctness {mix['correctness']}.", "",
              ("Linear time: CPU microseconds per 1000 characters (both rewards) on a pattern repeated 10k, "
               "40k and 160k times; a flat row means linear time."), "",
              "| pattern | x10000 | x40000 | x160000 |", "|---|---|---|---|"]
    lines += [f"| `{p!r}` | " + " | ".join(str(v) for v in row.values()) + " |"
              for p, row in r["adversarial_cpu_us_per_kchar"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
