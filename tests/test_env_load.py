"""`vlrl serve-env` under load, on 127.0.0.1: 32 clients at once (half over HTTP sessions, half over OpenEnv's
WebSocket) play whole episodes, every step checked against the local game: none lost, none crossed, none left
open. Through the old standard-library server, 3 of 32 such clients got a connection reset."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from env_load import load


def test_32_concurrent_clients_play_whole_episodes_without_a_lost_or_crossed_session():
    result = load(clients=32, episodes=2)
    assert result["errors"] == [] and result["failed_clients"] == 0
    assert result["episodes"] == 64 and result["crossed"] == 0 and result["steps"] >= 64
    assert result["sessions_left"] == 0
    print(result)  # the figures, with -s
