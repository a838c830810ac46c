"""Where vlrl caches what it builds or fetches once: the tiny models and their warm starts, llama.cpp's converters;
and whether the Hugging Face hub may be reached at all (`hub_offline`), and the shape of its ids (`HUB_ID`).

`$VLRL_CACHE` when set, else ~/.cache/vlrl; read at each call, so a test or a script may point it elsewhere after
importing vlrl.

    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, VLRL_CACHE="/tmp/elsewhere"):
    ...     str(cache_dir())
    '/tmp/elsewhere'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # owner/name, as the hub spells model and data set ids


def cache_dir() -> Path:
    """The cache root: `$VLRL_CACHE`, else ~/.cache/vlrl."""
    return Path(os.environ.get("VLRL_CACHE") or Path.home() / ".cache" / "vlrl")


def hub_offline(value: str | None = None) -> bool:
    """Whether HF_HUB_OFFLINE (or `value`) is on, read as huggingface_hub reads it (1, true, yes, on; any case):
    only local models and data then load. The one reading of it, for every message and report that says so.

    >>> hub_offline("0"), hub_offline("True"), hub_offline("")
    (False, True, False)
    """
    if value is None:
        value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().upper() in ("1", "TRUE", "YES", "ON")
