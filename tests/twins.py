"""Run a store module's blocking and async twins through the same test cases.

`Twins(module, db_url, "sync").name(args)` calls `module.name(conn, args)` on a connection of its own;
with "async" it calls `module.aname(conn, args)` on an AsyncConnection, run to its end on a loop of its
own. A test parametrised over SIDES then proves both twins give the same answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psycopg

SIDES = ["sync", "async"]


class Twins:
    def __init__(self, module: ModuleType, db_url: str, side: str) -> None:
        self.module, self.side = module, side
        self.loop = asyncio.new_event_loop() if side == "async" else None
        if self.loop is None:
            self.conn: psycopg.Connection | psycopg.AsyncConnection = psycopg.connect(db_url, autocommit=True)
        else:
            self.conn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(db_url, autocommit=True))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if self.loop is None:
            blocking = getattr(self.module, name)
            return lambda *args: blocking(self.conn, *args)
        twin, loop = getattr(self.module, f"a{name}"), self.loop
        return lambda *args: loop.run_until_complete(twin(self.conn, *args))

    def idle(self) -> bool:
        """Whether the connection is outside any transaction (none was left open or failed)."""
        return self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def close(self) -> None:
        if self.loop is None:
            self.conn.close()
        else:
            self.loop.run_until_complete(self.conn.close())
            self.loop.close()
