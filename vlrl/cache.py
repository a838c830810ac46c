"""Where vlrl caches what it builds or fetches once: the tiny models and their warm starts, llama.cpp's converters.

`$VLRL_CACHE` when set, else ~/.cache/vlrl; read at each call, so a test or a script may point it elsewhere after
importing vlrl.

    >>> import os; os.environ["VLRL_CACHE"] = "/tmp/vlrl-doctest"; str(cache_dir())
    '/tmp/vlrl-doctest'
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root: `$VLRL_CACHE`, else ~/.cache/vlrl."""
    return Path(os.environ.get("VLRL_CACHE") or Path.home() / ".cache" / "vlrl")
