"""`vlrl serve-env crafter` under chaos: many clients at once against the real command (a subprocess, with an API
key), each doing random resets, steps, closes, resets with new options, wrong keys, malformed and oversized bodies,
WebSocket episodes and disconnects in the middle of a request, while the server is sent SIGTERM once and started
again on the same port. Loopback only; it stops by itself.

    python bench/env_chaos.py                                  # 64 clients, 300 s -> bench/results/env_chaos.{json,md}
    python bench/env_chaos.py --clients 8 --seconds 30 --output /tmp/chaos    # a smoke run

The clients are bench/chaos_client.py; tests/test_env_chaos.py runs 12 s of it with 6 clients.

What it checks, beside counting requests by status code and their latency:
- every answer is the one expected (a 4xx where the request was wrong, 200 where it was right), and every refusal
  is a JSON {"error": one line};
- cross-session answers: each client replays every episode it plays with a local Crafter of the same seed and
  options, so an observation, reward or end that is not its own game's (another client's frame, a lost or doubled
  step) is counted;
- closed-session steps: after a close, or a reset with new options, the old session is stepped again: anything but
  404 is counted (a session of the old process after the restart is lost too: 404 expected);
- the server's RSS every 2 s, and every 5xx with its cause (from the answers and the server's own log).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the server subprocess runs its vlrl too
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from chaos_client import OPTION_SETS, SEEDS, SERVER_OPTIONS, Client

from vlrl.envs import make


class Server:
    """`vlrl serve-env crafter` as a subprocess on `port` with `key`; its log in `log_dir`; `generation` counts
    starts (a session of an earlier generation is gone)."""

    def __init__(self, port: int, key: str, log_dir: Path):
        self.port, self.key, self.log_dir, self.generation, self.process = port, key, log_dir, 0, None
        self.down_since: float | None = None

    def start(self) -> float:
        """Starts the next generation; returns the seconds until it answered /health."""
        started = time.monotonic()
        log = open(self.log_dir / f"server{self.generation + 1}.log", "wb")  # noqa: SIM115 -- the process writes it
        option = [f"--set={k}={v}" for k, v in SERVER_OPTIONS.items()]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vlrl.cli", "serve-env", "crafter", "--port", str(self.port), *option],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "ENVIRONMENT_API_KEY": self.key, "PYTHONPATH": path})
        log.close()
        self.generation += 1  # a session opened from now on is this process's
        while self.health() is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: see {log.name}")
            time.sleep(0.1)
        self.down_since = None
        return time.monotonic() - started

    def health(self) -> dict | None:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            connection.request("GET", "/health", headers={"X-API-Key": self.key})
            answer = connection.getresponse()
            return json.loads(answer.read()) if answer.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def terminate(self, timeout: float = 60.0) -> dict:
        """SIGTERM and wait: {"exit_code", "seconds_to_exit"} (SIGKILL and exit_code None past `timeout`)."""
        self.down_since = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        return {"exit_code": code, "seconds_to_exit": round(time.monotonic() - self.down_since, 2)}

    def rss_mb(self) -> float | None:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None


HANDSHAKE_NOTE = "ASGI callable returned without completing handshake."  # see server_log


def server_log(log_dir: Path) -> dict:
    """The server's own account (its log runs at warning level, so 5xx show as their tracebacks): each error with
    its cause. uvicorn up to 0.54 logs HANDSHAKE_NOTE at ERROR after the Guard's 401 denial although the client got
    the 401 (its sans-I/O protocol did not count a denial response as the end of the handshake; 0.55 does, and logs
    nothing): those are counted apart, matched against the 401 handshakes the clients saw (one each, or none)."""
    errors, handshake_notes = [], 0
    for log in sorted(log_dir.glob("server*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines):
            if HANDSHAKE_NOTE in line:
                handshake_notes += 1
            elif line.startswith(("ERROR", "Traceback", "CRITICAL")):
                cause = next((later for later in lines[number + 1:]
                              if re.match(r"^\w+(\.\w+)*(Error|Exception|Disconnect)", later)), "")
                errors.append(f"{log.name}: {line.strip()} {cause.strip()}".strip())
    return {"errors": [e for e in errors if not e.endswith("Traceback (most recent call last):")],
            "handshake_notes": handshake_notes}


def chaos(clients: int = 64, seconds: float = 300.0, restart_at: float | None = None, warmup_s: float | None = None,
          seeds: tuple = SEEDS) -> dict:
    """Runs the chaos (see the module docstring) and returns its figures."""
    restart_at = seconds * 0.2 if restart_at is None else restart_at
    warmup_s = min(60.0, seconds / 5) if warmup_s is None else warmup_s
    for options in OPTION_SETS:  # the replays' worlds, made before the clock starts (the server makes its own)
        for seed in seeds:
            make("crafter", **{**SERVER_OPTIONS, **options}).reset(seed)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_dir = Path(tempfile.mkdtemp(prefix="env_chaos_"))
    server = Server(port, secrets.token_hex(16), log_dir)
    first_start = server.start()
    started = time.monotonic()
    deadline = started + seconds
    workers = [Client(i, server, deadline, tuple(seeds)) for i in range(clients)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    rss, sigterm, stop = [], {}, threading.Event()

    def sample():  # the server's RSS (and open sessions) every 2 s, through the restart too
        while not stop.wait(2.0):
            mb, health = server.rss_mb(), server.health()
            if mb is not None:
                rss.append([round(time.monotonic() - started, 1), server.generation, round(mb, 1),
                            health["sessions"] if health else None])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(max(0.0, started + restart_at - time.monotonic()))
    if time.monotonic() < deadline:
        down = time.monotonic()
        sigterm = {"at_s": round(down - started, 1), **server.terminate()}
        sigterm["restart_s"] = round(server.start(), 2)
        sigterm["down_s"] = round(time.monotonic() - down, 2)
    for thread in threads:
        thread.join(timeout=max(1.0, deadline - time.monotonic() + 120))
    stop.set()
    time.sleep(0.5)
    health = server.health()
    final = server.terminate()
    return summary(workers, server_log(log_dir), rss, sigterm, final, health, clients=clients, seconds=seconds,
                   warmup_s=warmup_s, first_start=first_start, stuck=sum(t.is_alive() for t in threads),
                   log_dir=log_dir)


def rss_growth(rss: list, warmup_s: float, seconds: float) -> dict:
    """RSS growth of the server that ran longest, from just after its warm-up to the end of the clients' traffic:
    the medians of the first and last five samples past `warmup_s` of its life."""
    lives = collections.defaultdict(list)
    for t, generation, mb, _ in rss:
        if t <= seconds:
            lives[generation].append((t, mb))
    generation, life = max(lives.items(), key=lambda item: item[1][-1][0] - item[1][0][0])
    after = [mb for t, mb in life if t - life[0][0] >= warmup_s]
    if len(after) < 10:
        return {"generation": generation, "growth": None, "samples": len(after)}
    first, last = statistics.median(after[:5]), statistics.median(after[-5:])
    return {"generation": generation, "warmup_s": warmup_s, "growth": round(last / first - 1, 4),
            "after_warmup_mb": round(first, 1),
            "end_mb": round(last, 1), "peak_mb": max(after), "samples": len(after)}


def summary(workers, log, rss, sigterm, final, health, **run) -> dict:
    tallies = [w.tally for w in workers]

    def joined(key):
        return [x for t in tallies for x in t[key]]

    status = sum((t["status"] for t in tallies), collections.Counter())
    latency = collections.defaultdict(list)
    for t in tallies:
        for kind, values in t["latency_ms"].items():
            latency[kind].extend(values)
    every = [x for values in latency.values() for x in values]
    client_5xx = sum(n for code, n in status.items() if code >= 500)
    websocket = sum((t["ws"] for t in tallies), collections.Counter())
    growth = rss_growth(rss, run["warmup_s"], run["seconds"])
    connection_errors = joined("connection_errors")
    return {
        "clients": run["clients"], "seconds": run["seconds"], "env": f"crafter {SERVER_OPTIONS}",
        "requests": sum(status.values()), "status_counts": {str(k): v for k, v in sorted(status.items())},
        "server_errors": max(client_5xx, len(log["errors"])), "server_error_causes": log["errors"][:50],
        "server_log_handshake_notes": log["handshake_notes"],
        "websocket_handshakes_refused_401": websocket["handshake 401"],
        "cross_session_answers": len(joined("cross")), "cross_session_examples": joined("cross")[:10],
        "closed_session_steps": len(joined("closed_steps")), "closed_session_examples": joined("closed_steps")[:10],
        "answers_checked": sum(t["steps_checked"] for t in tallies),
        "unexpected_answers": len(joined("unexpected")), "unexpected_examples": joined("unexpected")[:20],
        "refusals_without_one_line_reason": len(joined("no_reason")), "no_reason_examples": joined("no_reason")[:10],
        "websocket_messages": dict(websocket),
        "sessions_lost_to_restart": sum(t["lost_to_restart"] for t in tallies),
        "connection_errors_during_restart": sum(1 for when, _ in connection_errors if when == "restart"),
        "connection_errors_while_up": sum(1 for when, _ in connection_errors if when == "up"),
        "latency_ms": {"p50": percentile(every, 0.5), "p99": percentile(every, 0.99),
                       **{kind: {"n": len(v), "p50": percentile(v, 0.5), "p99": percentile(v, 0.99)}
                          for kind, v in sorted(latency.items()) if len(v) >= 20}},
        "sigterm": sigterm, "final_sigterm": final, "first_start_s": round(run["first_start"], 2),
        "sessions_left": health["sessions"] if health else None, "clients_stuck": run["stuck"],
        "rss_growth": growth["growth"], "rss": growth, "rss_samples": rss, "server_logs": str(run["log_dir"]),
    }


def markdown(r: dict) -> str:
    statuses = ", ".join(f"{code}: {n}" for code, n in r["status_counts"].items())
    kinds = "\n".join(f"| {kind} | {v['n']} | {v['p50']} | {v['p99']} |" for kind, v in r["latency_ms"].items()
                      if isinstance(v, dict))
    rss, s = r["rss"], r["sigterm"]
    series = ", ".join(f"{t:.0f} s: {mb:.0f} MB ({n} sessions)" for t, _, mb, n in r["rss_samples"][::15])
    causes = "\n".join(f"- `{c}`" for c in r["server_error_causes"]) or "none"
    unexpected = "\n".join(f"- {c}" for c in r["unexpected_examples"]) or "none"
    return f"""# `vlrl serve-env crafter` under chaos

`python bench/env_chaos.py --clients {r['clients']} --seconds {r['seconds']:g}`: {r['clients']} clients for
{r['seconds']:g} s against `vlrl serve-env crafter --set size=64` (a subprocess, ENVIRONMENT_API_KEY set) on 127.0.0.1,
each doing random steps, resets, closes, resets with new options, wrong keys, malformed and oversized bodies,
WebSocket episodes and hang-ups in the middle of a request; SIGTERM once at {s.get('at_s')} s, then started again.
Every answer to an episode is checked against the same seed and replies played by a local Crafter.

| target | result |
|---|---|
| 5xx | {r['server_errors']} |
| cross-session answers (of {r['answers_checked']} observations checked) | {r['cross_session_answers']} |
| steps answered from a closed session | {r['closed_session_steps']} |
| server RSS growth after warm-up | {r['rss_growth']} ({rss.get('after_warmup_mb')} -> {rss.get('end_mb')} MB, peak {rss.get('peak_mb')} MB) |
| refusals without a one-line reason | {r['refusals_without_one_line_reason']} |
| answers other than the one expected | {r['unexpected_answers']} |

Requests: {r['requests']} ({statuses}).
WebSocket messages: {r['websocket_messages']}. The server's log holds {r['server_log_handshake_notes']} lines of uvicorn's
"{HANDSHAKE_NOTE}" for the {r['websocket_handshakes_refused_401']} WebSocket handshakes refused with
401 (uvicorn up to 0.54 logs one at ERROR after each denial was sent, 0.55 none; no 5xx).
Latency over all requests: p50 {r['latency_ms']['p50']} ms, p99 {r['latency_ms']['p99']} ms (2 CPU cores shared
with other work; the server, 64 clients and their local replays all run on them).

| request | n | p50 ms | p99 ms |
|---|---|---|---|
{kinds}

SIGTERM: the server shut down gracefully (in-flight requests answered, every session closed) and exited with
{s.get('exit_code')} (uvicorn re-raises the signal once it has shut down) in {s.get('seconds_to_exit')} s; the next one answered after
{s.get('restart_s')} s ({s.get('down_s')} s down). Connections refused while it was down: {r['connection_errors_during_restart']};
while it was up: {r['connection_errors_while_up']}. Sessions lost to the restart (404 afterwards, as they should be):
{r['sessions_lost_to_restart']}. Sessions left open after every client closed its own: {r['sessions_left']}.
The final SIGTERM: exit {r['final_sigterm']['exit_code']} in {r['final_sigterm']['seconds_to_exit']} s.

Server RSS (every 30 s; the warm-up is the first {r['rss'].get('warmup_s')} s of the longest-lived server, its
growth the median of its last 5 samples over that of its first 5 after warm-up): {series}.

5xx and their causes: {causes}

Unexpected answers (first 20): {unexpected}
"""


def main() -> None:
    from results_io import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--restart-at", type=float, help="seconds into the run to send SIGTERM (default: a fifth)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "env_chaos"))
    args = parser.parse_args()
    write_results(chaos(args.clients, args.seconds, args.restart_at), args.output, markdown)


if __name__ == "__main__":
    main()
