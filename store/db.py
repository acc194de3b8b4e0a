"""Where the database is: DATABASE_URL when set, else the embedded server."""

from __future__ import annotations

import os
import re

from store.config import Settings


def database_url(settings: Settings) -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from store import embedded

    return embedded.ensure_running(settings.data_dir)


def redact(url: str) -> str:
    """The URL with any password replaced, for logs and messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)
