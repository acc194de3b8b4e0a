"""Where the database is: DATABASE_URL when set, else the embedded server."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from store.config import Settings
from store.errors import DatabaseUnavailable


def database_url(settings: Settings) -> str:
    """DATABASE_URL when set (checked to parse, so a malformed one fails here with the password hidden)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        try:
            conninfo_to_dict(url)
        except psycopg.Error as exc:
            # libpq quotes the part it could not parse, which can be the password itself.
            raise DatabaseUnavailable(f"DATABASE_URL is not a valid connection string: {scrub(str(exc), url)}; "
                                      "expected postgresql://user:password@host:port/database") from None
        return url
    from store import embedded

    return embedded.ensure_running(settings.data_dir)


def redact(url: str) -> str:
    """The URL with any password replaced, for logs and messages."""
    return scrub(re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url), url)


def scrub(text: str, url: str) -> str:
    """`text` (an error message about `url`) with every spelling of the URL's password replaced by ***."""
    for secret in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text.strip()


def _passwords(url: str) -> set[str]:
    found: list[str] = []
    userinfo = re.search(r"://([^@/?#]*)@", url)  # URI form: user:password@
    if userinfo and ":" in userinfo.group(1):
        found.append(userinfo.group(1).split(":", 1)[1])
    found += re.findall(r"[?&]password=([^&#]*)", url)  # URI form: ?password=
    for quoted, bare in re.findall(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^\s']\S*))", url):  # key=value form
        found.append(quoted or bare)
    return {spelling for raw in found for spelling in (raw, unquote(raw)) if spelling}
