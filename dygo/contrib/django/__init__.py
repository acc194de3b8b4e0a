"""dygo in a Django project: add "dygo.contrib.django" to INSTALLED_APPS.

Then `manage.py dygo worker|serve|migrate ...` runs dygo with the project's database (from
DATABASES) and its jobs (each installed app's `jobs.py`, imported when Django starts, so the web
process validates what it enqueues too), and `enqueue(django.db.connection, ...)` joins the
current `transaction.atomic()` block (store/connections.py). Optional settings, all in one dict:

    DYGO = {
        "DATABASE": "default",          # the DATABASES alias dygo's processes use
        "CONFIG_DIR": BASE_DIR / "config",  # queues.yml and dygo.yml (else $DYGO_CONFIG_DIR, else ./config)
    }
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Django's own OPTIONS that are not libpq connection parameters.
DJANGO_ONLY_OPTIONS = {"isolation_level", "server_side_binding", "assume_role", "pool", "cursor_factory", "context"}


def dygo_settings() -> dict[str, Any]:
    from django.conf import settings

    configured: dict[str, Any] = dict(getattr(settings, "DYGO", {}))
    unknown = set(configured) - {"DATABASE", "CONFIG_DIR"}
    if unknown:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"settings.DYGO: unknown keys {sorted(unknown)}; known: DATABASE, CONFIG_DIR")
    return configured


def database_url(alias: str | None = None) -> str:
    """The libpq connection string of DATABASES[alias] (default: DYGO["DATABASE"], else "default")."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from psycopg.conninfo import make_conninfo

    alias = alias or dygo_settings().get("DATABASE", "default")
    database = settings.DATABASES.get(alias)
    if database is None:
        raise ImproperlyConfigured(f"settings.DYGO['DATABASE'] names {alias!r}, which DATABASES does not have")
    if database.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] uses {database.get('ENGINE')!r}: dygo needs 'django.db.backends.postgresql'"
        )
    fields = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}
    params = {key: database[name] for key, name in fields.items() if database.get(name)}
    options = database.get("OPTIONS", {})
    params.update({key: value for key, value in options.items() if key not in DJANGO_ONLY_OPTIONS})
    return make_conninfo("", **{key: str(value) for key, value in params.items()})


def dygo_environment() -> dict[str, str]:
    """What dygo's processes read from the environment, from Django's settings."""
    environment = {"DATABASE_URL": database_url()}
    config_dir = dygo_settings().get("CONFIG_DIR")
    if config_dir is not None:
        environment["DYGO_CONFIG_DIR"] = str(Path(config_dir))
    return environment


def run(argv: list[str]) -> int:
    """`dygo <argv>` in this process, Django set up, with the project's database and configuration."""
    from dygo.cli import main

    os.environ.update(dygo_environment())
    return main(argv)
