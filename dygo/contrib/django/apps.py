"""The Django app: imports each installed app's `jobs.py` when Django starts."""

from __future__ import annotations

import os
from pathlib import Path

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DygoConfig(AppConfig):  # type: ignore[misc]  # Django has no type hints
    name = "dygo.contrib.django"
    label = "dygo"
    verbose_name = "dygo"

    def ready(self) -> None:
        from dygo.contrib.django import dygo_settings

        # Enqueue checks a job's queue against queues.yml, read from DYGO_CONFIG_DIR in a process that never
        # loaded the configuration, as a web process does not.
        config_dir = dygo_settings().get("CONFIG_DIR")
        if config_dir is not None:
            os.environ.setdefault("DYGO_CONFIG_DIR", str(Path(config_dir)))
        autodiscover_modules("jobs")
