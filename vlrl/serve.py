"""Serves the browser reward calculator (`rewards/`) on localhost: `vlrl serve-rewards [--port N] [--run DIR]`.

The page runs vlrl's own `answers.py` and `rewards.py` in the browser through Pyodide (CPython compiled to
WebAssembly, installed from npm into `rewards/node_modules/`, never fetched from a CDN), so it computes exactly what
Python computes. The server maps URLs onto the source tree's layout, so the page's relative links work the same
under this server and under any static server started at the repository root:

    /rewards/...                       the page and its assets (index.html, calculator.js, calculator.py, golden/)
    /rewards/node_modules/pyodide/...  the Pyodide runtime
    /vlrl/<module>.py                  the source of the vlrl package that this Python imports
    /run/...                           the run directory given with --run (eval_before.jsonl, eval_after.jsonl)

    >>> page_dir().joinpath("index.html").is_file()
    True
"""

from __future__ import annotations

import functools
import http.server
import os
import posixpath
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import ClassVar

import vlrl

PACKAGE_DIR = Path(vlrl.__file__).resolve().parent
INSTALL_HINT = "bash {page}/install.sh   (npm ci there; in a checkout: make calculator)"


def page_dir(explicit: str | Path | None = None) -> Path:
    """The folder holding the calculator page: `explicit`, $VLRL_REWARDS_DIR, the source checkout, or the install.

    A wheel carries the page under `<prefix>/share/vlrl/rewards` (pyproject's data-files); an editable install and a
    source checkout use `rewards/` beside the package.
    """
    candidates = [explicit, os.environ.get("VLRL_REWARDS_DIR"), PACKAGE_DIR.parent / "rewards",
                  Path(sys.prefix) / "share" / "vlrl" / "rewards"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "index.html").is_file():
            return Path(candidate).resolve()
    raise FileNotFoundError(
        f"the reward calculator page (index.html) was not found in any of {[str(c) for c in candidates if c]}; "
        "run from a vlrl source checkout, or pass --page-dir / set VLRL_REWARDS_DIR to the folder holding index.html.")


def pyodide_dir(page: Path, explicit: str | Path | None = None) -> Path:
    """The Pyodide runtime: `explicit`, $VLRL_PYODIDE_DIR, or `<page>/node_modules/pyodide` (npm's install)."""
    candidates = [explicit, os.environ.get("VLRL_PYODIDE_DIR"), page / "node_modules" / "pyodide"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "pyodide.asm.wasm").is_file():
            return Path(candidate).resolve()
    raise FileNotFoundError(
        f"the Pyodide runtime (pyodide.asm.wasm) was not found in any of {[str(c) for c in candidates if c]}; "
        f"install it with: {INSTALL_HINT.format(page=page)}")


class CalculatorHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a fixed set of folders by URL prefix, and nothing outside them (a `..` cannot climb out)."""

    extensions_map: ClassVar[dict[str, str]] = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".wasm": "application/wasm", ".py": "text/x-python; charset=utf-8",
                      ".jsonl": "application/x-ndjson; charset=utf-8", ".md": "text/markdown; charset=utf-8"}

    def __init__(self, *args, mounts: dict[str, Path], quiet: bool = False, **kwargs):
        self.mounts, self.quiet = mounts, quiet
        super().__init__(*args, directory=str(mounts["/rewards/"]), **kwargs)

    def do_GET(self):
        if urllib.parse.urlsplit(self.path).path in ("", "/"):
            self.send_response(302)
            self.send_header("Location", "/rewards/")
            self.end_headers()
            return
        super().do_GET()

    def translate_path(self, path: str) -> str:
        url_path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        path = posixpath.normpath(url_path) + ("/" if url_path.endswith("/") else "")
        for prefix in sorted(self.mounts, key=len, reverse=True):  # the longest prefix wins (pyodide in /rewards/)
            if path == prefix.rstrip("/") or path.startswith(prefix):
                root = self.mounts[prefix]
                target = (root / path[len(prefix):]).resolve()
                if target == root or root in target.parents:
                    if prefix == "/vlrl/" and target.suffix != ".py":
                        break  # only the package's Python sources, never caches or data
                    return str(target)
                break
        return str(Path(self.mounts["/rewards/"]) / "__not_found__")

    def end_headers(self):
        self.send_header("Cache-Control", "no-cache")  # revalidate: an edited rewards.py shows on reload
        super().end_headers()

    def log_message(self, format, *args):
        if not self.quiet:
            super().log_message(format, *args)


def make_server(port: int = 8765, *, run_dir: str | Path | None = None, page: str | Path | None = None,
                pyodide: str | Path | None = None, host: str = "127.0.0.1",
                quiet: bool = False) -> http.server.ThreadingHTTPServer:
    """A server for the calculator, bound to `host` (localhost only by default); port 0 picks a free port.

    Args:
        port: the TCP port.
        run_dir: a run directory whose eval records the page can load (served under /run/).
        page: the page folder (default: found by `page_dir`).
        pyodide: the Pyodide runtime folder (default: found by `pyodide_dir`).

    Returns:
        The server, not yet serving: call `serve_forever()` (or use `serve_in_thread`).
    """
    page = page_dir(page)
    mounts = {"/rewards/": page, "/rewards/node_modules/pyodide/": pyodide_dir(page, pyodide), "/vlrl/": PACKAGE_DIR}
    if run_dir is not None:
        if not Path(run_dir).is_dir():
            raise FileNotFoundError(f"run directory {run_dir} does not exist; pass a folder with eval_*.jsonl files.")
        mounts["/run/"] = Path(run_dir).resolve()
    handler = functools.partial(CalculatorHandler, mounts=mounts, quiet=quiet)
    return http.server.ThreadingHTTPServer((host, port), handler)


def page_url(server: http.server.HTTPServer, *, with_run: bool = False) -> str:
    """The page's address on `server` (loading the run's eval records when `with_run`)."""
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/rewards/" + ("?records=/run/" if with_run else "")


def serve_in_thread(server: http.server.HTTPServer) -> threading.Thread:
    """Serves in a daemon thread (for tests and notebooks); stop with `server.shutdown()`."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def serve_until_interrupted(server: http.server.HTTPServer) -> None:
    """Serves until Ctrl-C (the commands `vlrl serve-rewards` and `vlrl serve-env`), then closes the socket."""
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
