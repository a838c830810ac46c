"""`OpenEnvEnv`: any OpenEnv server as a vlrl environment, `[env] name = "openenv:URL"`. It speaks OpenEnv's
WebSocket protocol (/ws: reset, step, state, close; one session per connection) and reads the server's /schema
and /metadata to learn how a reply becomes an action:

- an action field of names (a JSON-schema `enum`): the reply's actions, parsed by name as vlrl's own
  environments parse them (`parse_actions`), each sent as one step ({"move": "left"});
- an integer field with `actions = [...]` naming its values in order: each named action sent as its index;
- a text field (`reply`, `message`, `text`, ...): the whole reply sent as it is, one step a turn (vlrl's own
  `serve-env` servers take this, and give the same episode as the local environment).

    env = make("openenv:http://127.0.0.1:8000")                          # the field found from /schema
    env = make("openenv:http://127.0.0.1:8000", action_field="message")   # or named
    obs = env.reset(seed=3); step = env.step("<SOLUTION>left</SOLUTION>")

An observation's picture is its `image` (or `pixels`, `frame`, `rgb`, `screenshot`): a data URL, base64 or an
HxWx3 array of numbers; its text is `text`, else the other fields as JSON. Success is the server's own (`metrics`
in a step's metadata, as vlrl's servers send at the end), else a return above `success_return`. Replies over an
API key: ENVIRONMENT_API_KEY (or `api_key`) as `Authorization: Bearer KEY`.

Only `reset` opens a session. A session whose connection fails (a timeout, a dropped connection) is closed, so the
server ends its episode, and every later `step` or `metrics` raises EnvError saying the episode is gone until the
next `reset`: a step never lands in a fresh session that has no episode.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import urllib.error
import urllib.request
from typing import ClassVar

from vlrl.base.errors import ConfigError, EnvError, MissingExtra
from vlrl.envs.base import Env, Observation, Step, parse_actions
from vlrl.envs.remote import auth_headers

IMAGE_KEYS = ("image", "pixels", "frame", "rgb", "screenshot")
TEXT_FIELDS = ("reply", "message", "text", "action", "command", "content")
MAX_MESSAGE = 64 << 20  # an observation message: pictures as data URLs or arrays of numbers


class OpenEnvEnv(Env):
    """The client of one OpenEnv server: one WebSocket session (one episode at a time) per OpenEnvEnv.

    Args:
        url: the server's address, http(s)://HOST:PORT (ws:// is derived).
        action_field: the action's field to fill (default: found from the action schema).
        actions: names of an integer action field's values, in order.
        max_actions: actions a reply may give per turn (named actions only; a text action is one step).
        timeout: seconds to wait for each answer.
        success_return: an episode whose server reports no success succeeds with a return above this.
        api_key: the server's API key (default: ENVIRONMENT_API_KEY, when set).
        reset_options: sent with every reset (OpenEnv's custom reset parameters, e.g. a vlrl server's `size`).
    """

    # the client's own; `reset_options` are the server's to check
    OPTIONS: ClassVar[dict] = {"action_field": (str, None), "actions": (list,), "max_actions": (int, 1, 64),
               "timeout": (float, 0.1, 86400), "success_return": (float, -1e12, 1e12), "api_key": (str, None)}

    def __init__(self, url: str, action_field: str | None = None, actions: list[str] | None = None,
                 max_actions: int = 1, timeout: float = 60.0, success_return: float = 0.0,
                 api_key: str | None = None, **reset_options):
        self.url, self.timeout, self.success_return = url.rstrip("/"), timeout, success_return
        self.reset_options, self.headers, self._ws, self._lost = reset_options, auth_headers(api_key), None, None
        schema, metadata = self._get("/schema"), self._get("/metadata", optional=True)
        self.name = f"openenv:{metadata.get('name') or self.url}"
        self._description = metadata.get("description") or ""
        properties = ((schema.get("action") or {}).get("properties") or {})
        fields = [k for k in properties if k != "metadata"]
        required = [k for k in (schema.get("action") or {}).get("required", []) if k != "metadata"]
        field = action_field or (required[0] if len(required) == 1 else fields[0] if len(fields) == 1 else
                                 next((k for k in TEXT_FIELDS if k in properties), None))
        if field is None or field not in properties:
            raise ConfigError(f"{self.url}: choose the action field with action_field = one of {fields} (its action "
                              f"schema has {'no field ' + repr(action_field) if action_field else 'several'}).")
        spec = properties[field]
        self.field, self.max_actions = field, max_actions
        if spec.get("enum"):
            self.kind, self._values = "choice", list(spec["enum"])
            self.actions = tuple(str(v).lower().replace(" ", "_") for v in self._values)
        elif spec.get("type") == "integer" and actions:
            self.kind, self._values, self.actions = "index", list(range(len(actions))), tuple(actions)
        elif spec.get("type") == "string":
            self.kind, self.max_actions = "text", int(metadata.get("max_actions_per_turn") or 1)
            self.actions = tuple(metadata.get("actions") or actions or ())
        else:
            raise ConfigError(f"{self.url}: the action field {field!r} is {spec}; vlrl sends a reply as text, a name of "
                              "an enum, or an integer named by actions = [...] (pass action_field or actions).")
        self._turns, self._return, self._metrics, self._done = 0, 0.0, None, False

    # --- the interface ----------------------------------------------------------------------------------------

    def reset(self, seed: int) -> Observation:
        if self._ws is None:  # the one call that opens a session: a step never lands in a fresh one
            self._ws, self._lost = self._connect(), None
        data = self._send({"type": "reset", "data": {"seed": seed, **self.reset_options}})
        self._turns, self._return, self._metrics, self._done, self._seed = 0, 0.0, None, False, seed
        return self._observation(data.get("observation") or {})

    def step(self, reply: str) -> Step:
        if self._ws is None:
            raise self._no_episode("step")
        self._turns += 1
        if self.kind == "text":
            data = self._send({"type": "step", "data": {self.field: reply}})
            reward, info = float(data.get("reward") or 0.0), dict(data.get("metadata") or {})
        else:
            chosen, problem = parse_actions(reply, self.actions, self.max_actions)
            reward, executed, data = 0.0, [], {"observation": self._last, "done": False}
            for action in chosen:
                data = self._send({"type": "step", "data": {self.field: self._values[self.actions.index(action)]}})
                reward += float(data.get("reward") or 0.0)
                executed.append(action)
                if data.get("done"):
                    break
            info = {**(data.get("metadata") or {}), "actions": executed, "invalid": not chosen, "problem": problem}
        self._return += reward
        self._done = bool(data.get("done"))
        if isinstance(info.get("metrics"), dict):
            self._metrics = info.pop("metrics")
        return Step(self._observation(data.get("observation") or {}), reward, self._done, info)

    def metrics(self) -> dict:
        """The server's metrics (vlrl's servers send them at the end and in the session's state), else success (a
        return above `success_return`), return and length (turns)."""
        if self._metrics is not None:
            return dict(self._metrics)
        if self._lost is not None:
            raise self._no_episode("metrics")
        if self._ws is not None:
            state = self._send({"type": "state"})
            if isinstance(state.get("metrics"), dict):
                return dict(state["metrics"])
        return {"success": self._return > self.success_return, "return": self._return, "length": self._turns}

    def describe(self) -> str:
        if self.kind == "text" and self._description:
            return self._description
        return (self._description + " " if self._description else "") + super().describe()

    def close(self) -> None:
        """Ends the session (the server closes its environment); a server already gone is no error here."""
        if self._ws is not None:
            with contextlib.suppress(Exception):  # a connection already gone needs no goodbye
                self._ws.send(json.dumps({"type": "close"}))
                self._ws.close()
            self._ws = None

    # --- the wire ---------------------------------------------------------------------------------------------

    def _get(self, path: str, optional: bool = False) -> dict:
        request = urllib.request.Request(self.url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if optional and err.code == 404:
                return {}
            raise EnvError(f"the OpenEnv server at {self.url} refused GET {path} ({err.code}); is it an OpenEnv "
                           "server, and is ENVIRONMENT_API_KEY set if it needs one?") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise EnvError(f"no OpenEnv server answered at {self.url} ({getattr(err, 'reason', err)}); start it, "
                           "or check the address.") from None

    def _connect(self):
        """A new WebSocket session on the server (its environment opens with it, closes when it closes)."""
        try:
            from websockets.sync.client import connect
        except ImportError:
            raise MissingExtra("openenv: environments need the `websockets` package: pip install 'vlrl[envs]'") \
                from None
        ws_url = "ws" + self.url[len("http"):] if self.url.startswith("http") else self.url
        try:
            return contextlib.ExitStack().enter_context(connect(  # websockets 17 wants a context
                ws_url + "/ws", additional_headers=self.headers, open_timeout=self.timeout, max_size=MAX_MESSAGE))
        except Exception as err:  # noqa: BLE001 -- OSError, a timeout, websockets' own refusals
            raise EnvError(f"the OpenEnv server at {self.url} did not open a session ({type(err).__name__}: "
                           f"{err}).") from None

    def _no_episode(self, call: str) -> EnvError:
        if self._lost is not None:
            return EnvError(f"{self.url}: {call}() on a lost session: {self._lost}; its episode is gone on the "
                            "server, so reset(seed) starts another.")
        return EnvError(f"{self.url}: {call}() before reset(); call reset(seed) first.")

    def _send(self, message: dict) -> dict:
        """Sends one message on the session's WebSocket; the answer's data, or EnvError. A session that fails is
        closed (the server ends its episode) and stays lost: every later call but reset says so."""
        try:
            self._ws.send(json.dumps(message))
            answer = json.loads(self._ws.recv(timeout=self.timeout))
        except Exception as err:  # noqa: BLE001 -- OSError, TimeoutError, bad JSON, websockets' own errors
            with contextlib.suppress(Exception):  # a connection half gone closes as far as it can
                self._ws.close()
            self._ws = None
            self._lost = f"{message['type']} failed ({type(err).__name__}: {err})"
            raise EnvError(f"the OpenEnv session at {self.url} failed on {message['type']} ({type(err).__name__}: "
                           f"{err}); the session is closed and its episode gone: reset(seed) starts another.") from None
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            raise EnvError(f"the OpenEnv server at {self.url} refused {message['type']} "
                           f"({data.get('code', 'error')}): {data.get('message', '')}")
        return answer.get("data") or {}

    def _observation(self, data: dict) -> Observation:
        self._last = data
        image = next((data[k] for k in IMAGE_KEYS if data.get(k) is not None), None)
        text = data.get("text")
        if not isinstance(text, str):
            rest = {k: v for k, v in data.items() if k not in IMAGE_KEYS + ("metadata", "reward", "done")}
            text = json.dumps(rest, default=str)[:2000] if rest else ""
        return Observation(None if image is None else self._picture(image), text)

    def _picture(self, value):
        """An observation's picture: a data URL, base64 PNG/JPEG or an HxW(x3) array of numbers; never a path."""
        from vlrl.base.images import BadItem, load_image

        try:
            if isinstance(value, str) and not value.startswith("data:"):
                value = base64.b64decode(value, validate=True)
            elif isinstance(value, list):
                import numpy as np

                value = np.asarray(value, dtype=np.uint8)
            return load_image(value)
        except (BadItem, binascii.Error, ValueError, TypeError) as err:
            raise EnvError(f"{self.url} sent an observation picture that cannot be read ({err}).") from None
