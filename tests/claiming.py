"""Claims for tests: the store's one claim function (store/claim.py claim_jobs), the producer's, returning the
jobs only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from dygo.store.claim import claim_jobs
from dygo.store.leases import ClaimedJob


async def claim(conn: psycopg.AsyncConnection[Any], queue: str, n: int, owner: str, ttl: float) -> list[ClaimedJob]:
    """Claim up to `n` ready jobs of `queue`."""
    return (await claim_jobs(conn, {queue: n}, owner, ttl)).jobs


async def claim_queues(
    conn: psycopg.AsyncConnection[Any],
    slots: Mapping[str, int],
    owner: str,
    ttl: float,
    kind_free: Mapping[str, int] | None = None,
) -> list[ClaimedJob]:
    """Claim up to slots[queue] ready jobs of each queue, in claim order."""
    return (await claim_jobs(conn, slots, owner, ttl, kind_free=kind_free)).jobs
