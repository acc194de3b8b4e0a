"""The admin service (`dygo serve`), and its face for an application that mounts it in its own:

    from dygo.app import create_app, mount
    mount(app, "/jobs", create_app(authenticate=staff_only))

Names are imported on first use, so `import dygo.app.connections` (the CLI) does not build the web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dygo.app.main import create_app
    from dygo.app.mounting import Authenticate, mount, running

__all__ = ["Authenticate", "create_app", "mount", "running"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from dygo.app.main import create_app

        return create_app
    if name in ("Authenticate", "mount", "running"):
        from dygo.app import mounting as module

        return getattr(module, name)
    raise AttributeError(f"module 'dygo.app' has no attribute {name!r}")
