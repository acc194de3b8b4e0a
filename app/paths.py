"""Paths below the app's mount point.

Mounted inside another application (`app.mount("/jobs", dygo_app)`) or behind a proxy that strips a prefix
(uvicorn's `--root-path`), a request's ASGI `path` is the whole path the browser asked for and `root_path`
the part above this app. Every rule of this app about its own paths (which need a token, which page is the
dashboard's) reads the path below `root_path`, so a mount point can never move a path out of its rule.
"""

from __future__ import annotations

from starlette.types import Scope


def route_path(scope: Scope) -> str:
    """The request's path below the app's mount point (the whole path when the app is not mounted)."""
    path: str = scope["path"]
    root = scope.get("root_path", "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path
