"""Benchmark: how long the browser reward calculator takes to load, and to rescore one edit, in headless Chromium.

    python bench/calculator_load.py --runs 5 --output bench/results/calculator_load.json [--screenshots DIR]

Measures, from navigation start (the browser's own clock, performance.now()):
  - inputs_ms: the page is shown and its inputs take typing (DOMContentLoaded);
  - ready_ms: Pyodide is up, vlrl's answers.py/rewards.py are imported and the first scores are shown;
  cold = a fresh browser profile (nothing cached), warm = a reload (the runtime comes from the HTTP cache);
and rescore_ms: one edit (calculator.load of a typical case: Python scores it, the page redraws), median of 200.
Needs what tests/test_reward_calculator.py needs (rewards/install.sh --browser).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlrl.serve import make_server, page_url, serve_in_thread

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         "--window-size=1400,1250", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
CASE = {"completion": "<REASONING>The bars show 3 and 4 apples, so 3 + 4 = 7.</REASONING>\n<SOLUTION>7.0</SOLUTION>",
        "answer": "7", "question_type": "free_form", "precision": "", "choices": "", "unit": "", "answer_type": "integer"}
TIMES = """const nav = performance.getEntriesByType('navigation')[0];
return {inputs_ms: nav.domContentLoadedEventEnd, ready_ms: window.calculator.state.readyMs};"""
RESCORE = """const [fields, n] = arguments; const times = [];
for (let i = 0; i < n; i++) {
  const t0 = performance.now();
  window.calculator.load({...fields, completion: fields.completion + ' '.repeat(i % 2)});
  times.push(performance.now() - t0);
}
times.sort((a, b) => a - b); return times[Math.floor(n / 2)];"""


def browser(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def wait_ready(driver, timeout: float = 120.0) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        state = driver.execute_script("return document.documentElement.dataset.ready")
        if state == "true":
            return driver.execute_script(TIMES)
        if state == "failed":
            raise RuntimeError(driver.find_element("id", "status").text)
        time.sleep(0.05)
    raise TimeoutError("the page did not get ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output", default="bench/results/calculator_load.json")
    parser.add_argument("--screenshots", help="a folder for screenshots of the page in English and Chinese")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    server = make_server(0, quiet=True)
    serve_in_thread(server)
    url = page_url(server) + "?" + urllib.parse.urlencode({k: v for k, v in CASE.items() if v})
    cold, warm, rescore = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as profile:
            driver = browser(profile)
            try:
                driver.get(url)
                cold.append(wait_ready(driver))
                driver.refresh()
                warm.append(wait_ready(driver))
                rescore.append(driver.execute_script(RESCORE, CASE, 200))
                if args.screenshots and not Path(args.screenshots, "calculator_zh.png").exists():
                    Path(args.screenshots).mkdir(parents=True, exist_ok=True)
                    driver.save_screenshot(str(Path(args.screenshots, "calculator_en.png")))
                    driver.find_element("id", "lang-toggle").click()
                    driver.save_screenshot(str(Path(args.screenshots, "calculator_zh.png")))
            finally:
                driver.quit()
    server.shutdown()

    def summary(values: list[float]) -> dict:
        return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
                "max": round(max(values), 1)}

    result = {
        "command": "python " + " ".join(sys.argv),
        "runs": args.runs,
        "cold_inputs_ms": summary([r["inputs_ms"] for r in cold]),
        "cold_ready_ms": summary([r["ready_ms"] for r in cold]),
        "warm_inputs_ms": summary([r["inputs_ms"] for r in warm]),
        "warm_ready_ms": summary([r["ready_ms"] for r in warm]),
        "rescore_ms_median_of_200": summary(rescore),
        # The machine is shared: a load average above its CPU count means the page got part of a core.
        "load_average_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                    "chromium": subprocess.run(["chromium", "--version"], check=False, capture_output=True,
                                               text=True).stdout.strip()},
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
