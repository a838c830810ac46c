"""Whether a model's `name_or_path` can load, said at once and in one line: a local checkpoint directory, a hub id in
the local hub cache, or a hub id the hub answers for, asked once with a short timeout and no retries. Loading a name
that is none of these went through transformers' download code, whose retries took 82-88 s and 15 log lines before
its error; `vlrl validate` said "ok" to it.

    model_source_problem("tiny-dir-that-exists")        # None: it loads
    model_source_problem("./nosuch/model")              # "no directory ./nosuch/model here; give ..."
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from vlrl.base.cache import HUB_ID, hub_offline

HUB_TIMEOUT_S = 5.0  # one request: a hub that does not answer by then is taken as unreachable


def model_source_problem(name_or_path: str, *, timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when `name_or_path` can load here; else what is wrong and the fix, in one line (for "[model]
    name_or_path = ...: <it>").

    A local directory loads (what is in it is the loader's to check). A hub id (`owner/name`) loads when it is in
    the local hub cache, or, with HF_HUB_OFFLINE unset, when the hub answers for it within `timeout` seconds.
    Anything else is a local path that does not exist.

    >>> model_source_problem("./nosuch/model").startswith("no directory './nosuch/model' here")
    True
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return None
    if path.exists():
        return f"{name_or_path!r} is a file; give the checkpoint's directory (the one holding config.json)."
    if not HUB_ID.fullmatch(name_or_path):
        return (f"no directory {name_or_path!r} here, and it is not a hub id (owner/name); give a local checkpoint "
                "directory, a hub id such as 'Qwen/Qwen3-VL-2B-Instruct', or a model vlrl builds ('tiny', "
                "'tiny-small').")
    return hub_problem(name_or_path, timeout=timeout)


def hub_problem(repo_id: str, *, timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when the hub model `repo_id` can load: in the local hub cache, or answered for by the hub (one request,
    no retries, with the user's token when there is one, so a private model they can read counts)."""
    from huggingface_hub import get_token, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None  # downloaded before: loads offline too
    if hub_offline():
        return (f"{repo_id!r} is not in the local hub cache, and HF_HUB_OFFLINE is set: download it where the hub is "
                "reachable (or unset HF_HUB_OFFLINE), or give a local checkpoint directory.")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    token = get_token()
    request = urllib.request.Request(f"{endpoint}/api/models/{repo_id}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(1)
        return None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403, 404):
            return (f"the hub at {endpoint} has no model {repo_id!r} that this machine may read ({err.code}); check "
                    "the spelling, or log in (`hf auth login`) for a private or gated model.")
        return f"the hub at {endpoint} answered {err.code} ({err.reason}) for {repo_id!r}; try again later."
    except (urllib.error.URLError, OSError, ValueError) as err:
        return (f"{repo_id!r} is not in the local hub cache and the hub at {endpoint} is not reachable "
                f"({unreachable_reason(err, timeout)}); "
                "check the network, or set HF_HUB_OFFLINE=1 and give a local checkpoint directory.")


def unreachable_reason(err: Exception, timeout: float) -> str:
    """Why a request of `timeout` seconds got no answer, in a few words: the URL error's reason, or the timeout.

    >>> unreachable_reason(TimeoutError(), 5.0)
    'no answer within 5 s'
    """
    reason = getattr(err, "reason", err)
    if isinstance(reason, TimeoutError) or isinstance(err, TimeoutError):
        return f"no answer within {timeout:g} s"
    return str(reason)
