"""`RemoteEnv`: an environment served by `vlrl serve-env` (vlrl.envs.server has the protocol), used like a local
one. Standard library only (urllib).

    env = make("http://127.0.0.1:8766")           # or RemoteEnv(url, timeout=60, size=128)
    obs = env.reset(seed=3)                       # the server opens a session for this episode
    step = env.step("<SOLUTION>do</SOLUTION>")    # the same Step a local environment gives
    env.close()                                   # frees the session on the server

Options (e.g. `size=128`) are sent with each reset and override the server's own (`--set`). A server that is down,
slow past `timeout` or refusing a request raises `EnvError` naming its address and what it said. Where the server
needs an API key, the client sends ENVIRONMENT_API_KEY (or `api_key`) as `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import ClassVar

from vlrl.base.errors import EnvError
from vlrl.envs.base import Env, Observation, Step, from_data_url


class RemoteEnv(Env):
    """The client of one `vlrl serve-env` server: one session (one episode at a time) per RemoteEnv.

    Args:
        url: the server's address, http://HOST:PORT.
        timeout: seconds to wait for each answer (a reset of a new Crafter world takes ~1.5 s).
        api_key: the server's API key (default: the ENVIRONMENT_API_KEY variable, when set).
        options: the environment's own settings for this client's episodes (over the server's).
    """

    # the client's own; the environment's options are the server's to check (it answers a refused one with 400)
    OPTIONS: ClassVar[dict] = {"timeout": (float, 0.1, 86400), "api_key": (str, None)}

    def __init__(self, url: str, timeout: float = 60.0, api_key: str | None = None, **options):
        self.url, self.timeout, self.options, self.session = url.rstrip("/"), timeout, options, None
        self.headers = auth_headers(api_key)
        query = "?" + urllib.parse.urlencode({"options": json.dumps(options)}) if options else ""
        self._learn(self._call("GET", "/task_info" + query))

    def _learn(self, task: dict) -> None:
        """Takes the environment's name, actions and per-turn cap from its task_info."""
        self.name = task.get("name", "remote")
        self.actions = tuple(task.get("actions", ()))
        self.max_actions = int(task.get("max_actions_per_turn", 1))
        self._task = task

    def reset(self, seed: int) -> Observation:
        body = {"seed": seed, "session": self.session, "options": self.options or None}
        answer = self._call("POST", "/reset", body)
        self.session = answer["session"]
        self._learn(answer.get("task", self._task))
        return self._observation(answer["observation"])

    def step(self, reply: str) -> Step:
        if self.session is None:
            raise EnvError(f"{self.url}: step() before reset(); call reset(seed) first.")
        answer = self._call("POST", "/step", {"session": self.session, "action": reply})
        return Step(self._observation(answer["observation"]), float(answer["reward"]), bool(answer["done"]),
                    answer.get("info", {}))

    def metrics(self) -> dict:
        if self.session is None:
            return {"success": False, "return": 0.0, "length": 0}
        return self._call("GET", "/metrics?" + urllib.parse.urlencode({"session": self.session}))

    def describe(self) -> str:
        return self._task.get("action_description") or super().describe()

    def task_info(self) -> dict:
        return dict(self._task)

    def close(self) -> None:
        """Frees this client's session on the server; a server already gone is no error here."""
        if self.session is not None:
            try:
                self._call("POST", "/close", {"session": self.session})
            except EnvError:
                pass
            self.session = None

    def _observation(self, data: dict) -> Observation:
        from vlrl.base.images import BadItem

        try:
            image = None if data.get("image") is None else from_data_url(data["image"])
        except BadItem as err:
            raise EnvError(f"{self.url} sent an observation image that cannot be read ({err}).") from None
        return Observation(image, data.get("text") or "")

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        """One request; its JSON answer, or EnvError saying what went wrong and where."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            try:
                reason = json.loads(err.read()).get("error", "")
            except ValueError:
                reason = err.reason
            raise EnvError(f"the environment server at {self.url} refused {method} {path.split('?')[0]} "
                           f"({err.code}): {reason}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, TimeoutError) or isinstance(err, TimeoutError):
                reason = f"no answer within {self.timeout:g} s"
            raise EnvError(f"no environment server answered at {self.url} ({reason}); start one with "
                           "`vlrl serve-env NAME --port PORT`, or check the address.") from None
        except ValueError as err:
            raise EnvError(f"{self.url}{path} answered with something that is not JSON ({err}); is it a "
                           "`vlrl serve-env` server?") from None


def auth_headers(api_key: str | None = None) -> dict:
    """The header that carries an environment server's API key (`api_key`, else ENVIRONMENT_API_KEY), or none.

    >>> auth_headers("s3cret")
    {'Authorization': 'Bearer s3cret'}
    """
    key = api_key if api_key is not None else os.environ.get("ENVIRONMENT_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}
