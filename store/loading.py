"""Loading a project's jobs: import the job modules, check their queues, load the schedules.

It sits above both the registry and the schedules (schedules build on enqueue, which builds on the
registry), so no module of `store` imports one that imports it back.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

from dygo.store.config import Settings
from dygo.store.errors import ConfigError
from dygo.store.registry import Registry, registry
from dygo.store.schedules import load_schedules


def load_jobs(settings: Settings, modules: Iterable[str] | None = None) -> Registry:
    """Import the configured job modules, check every job names a configured queue, load the schedules."""
    # The project's modules load from the folder dygo runs in, first, as with `python -m`: the `dygo`
    # console script puts only its own bin folder on the path, and a project's `jobs` package must win
    # over any installed one. By now dygo's own packages are imported, so nothing of the project's
    # named `app` or `worker` can replace them.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules or settings.job_modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                raise ConfigError(
                    str(settings.config_dir / "dygo.yml"), f"jobs: {module}", "module not found; is it on PYTHONPATH?"
                ) from None
            raise
    registry.check_queues(settings)
    registry.queues = settings.queue_names
    registry.default_max_attempts = settings.default_max_attempts
    registry.schedules = load_schedules(settings, registry)
    return registry
