"""Load test of `vlrl serve-env`: many clients at once, each playing whole episodes over HTTP sessions (RemoteEnv)
or OpenEnv's WebSocket (openenv:URL), every step checked against the same episode played locally, so a lost
request, a crossed session (another client's frame) or a wrong metric is counted, not missed. Loopback only.

    python bench/env_load.py --clients 64 --episodes 4     # -> bench/results/env_load.{json,md}

tests/test_env_load.py runs `load()` with 32 clients on every test run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlrl.envs import make
from vlrl.envs.server import make_server

NAME, OPTIONS = "grid", {"size": 5, "difficulty": 3, "max_turns": 24}


def play_client(url: str, index: int, episodes: int, barrier: threading.Barrier, out: dict) -> None:
    """One client: `episodes` whole episodes of seeded random replies, each step compared with the local game.
    Even clients speak HTTP sessions, odd ones OpenEnv's WebSocket."""
    rng, local = random.Random(index), make(NAME, **OPTIONS)
    tally = {"steps": 0, "episodes": 0, "crossed": 0, "errors": [], "latency_ms": []}
    out[index] = tally
    client = None
    try:
        client = make(url) if index % 2 == 0 else make("openenv:" + url)
        barrier.wait(timeout=60)
        for episode in range(episodes):
            seed = 1000 * index + episode
            tally["crossed"] += client.reset(seed).image.tobytes() != local.reset(seed).image.tobytes()
            while True:
                reply = f"<SOLUTION>{rng.choice(local.actions)}</SOLUTION>"
                started = time.perf_counter()
                got = client.step(reply)
                tally["latency_ms"].append(1000 * (time.perf_counter() - started))
                want = local.step(reply)
                tally["steps"] += 1
                tally["crossed"] += (got.observation.image.tobytes() != want.observation.image.tobytes()
                                     or (got.reward, got.done, got.observation.text)
                                     != (want.reward, want.done, want.observation.text))
                if want.done or got.done:
                    break
            tally["crossed"] += client.metrics() != local.metrics()
            tally["episodes"] += 1
    except Exception as err:  # noqa: BLE001 -- a lost request is what this counts
        tally["errors"].append(f"{type(err).__name__}: {err}")
    finally:
        if client is not None:
            client.close()


def load(clients: int = 32, episodes: int = 2, max_sessions: int = 128) -> dict:
    """Starts a server on 127.0.0.1 and `clients` threads playing `episodes` each, all released at once.

    Returns:
        clients, episodes (played whole), steps, crossed (steps, resets or metrics unlike the local game),
        errors (the first few), seconds, steps_per_s, latency_ms_median / _p95, sessions_left (open after all
        clients closed: 0).
    """
    with make_server(NAME, OPTIONS, port=0, max_sessions=max_sessions) as server:
        barrier, out = threading.Barrier(clients + 1), {}
        threads = [threading.Thread(target=play_client, args=(server.url, i, episodes, barrier, out))
                   for i in range(clients)]
        for thread in threads:
            thread.start()
        barrier.wait(timeout=120)
        started = time.perf_counter()
        for thread in threads:
            thread.join(timeout=600)
        seconds = time.perf_counter() - started
        for _ in range(100):  # a WebSocket's session closes when the server sees the connection end
            sessions_left = server.service.health()["sessions"]
            if sessions_left == 0:
                break
            time.sleep(0.05)
    latencies = sorted(x for t in out.values() for x in t["latency_ms"])
    steps = sum(t["steps"] for t in out.values())
    return {"clients": clients, "episodes_each": episodes, "episodes": sum(t["episodes"] for t in out.values()),
            "steps": steps, "crossed": sum(t["crossed"] for t in out.values()),
            "errors": [e for t in out.values() for e in t["errors"]][:5],
            "failed_clients": sum(bool(t["errors"]) for t in out.values()), "seconds": round(seconds, 2),
            "steps_per_s": round(steps / seconds, 1),
            "latency_ms_median": round(statistics.median(latencies), 2) if latencies else None,
            "latency_ms_p95": round(latencies[int(0.95 * (len(latencies) - 1))], 2) if latencies else None,
            "sessions_left": sessions_left, "env": f"{NAME} {OPTIONS}"}


def markdown(r: dict) -> str:
    return (f"# `vlrl serve-env` under load\n\n`python bench/env_load.py --clients {r['clients']} --episodes "
            f"{r['episodes_each']}`: {r['clients']} concurrent clients on 127.0.0.1 (half HTTP sessions, half "
            f"OpenEnv WebSocket), {r['env']}.\n\n| | |\n|---|---|\n"
            f"| whole episodes played | {r['episodes']} of {r['clients'] * r['episodes_each']} |\n"
            f"| steps | {r['steps']} in {r['seconds']} s ({r['steps_per_s']}/s) |\n"
            f"| step latency | median {r['latency_ms_median']} ms, p95 {r['latency_ms_p95']} ms |\n"
            f"| crossed or wrong (against the local game) | {r['crossed']} |\n"
            f"| failed clients (lost requests, resets) | {r['failed_clients']} |\n"
            f"| sessions left open | {r['sessions_left']} |\n")


def main() -> None:
    from results_io import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "env_load"))
    args = parser.parse_args()
    write_results(load(args.clients, args.episodes), args.output, markdown)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
