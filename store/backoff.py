"""Deterministic exponential backoff: the same job and attempt always wait the same time."""

from __future__ import annotations

import hashlib

MAX_DELAY = 6 * 3600.0


def retry_delay(job_id: int, attempt: int, base: float) -> float:
    """Seconds before retrying after failed `attempt` (1-based): base * 2^(attempt-1), capped at 6 h,
    plus up to 25% jitter derived from (job_id, attempt) so retries of many jobs spread out."""
    delay = min(base * 2 ** (attempt - 1), MAX_DELAY)
    digest = hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=4).digest()
    jitter = int.from_bytes(digest, "big") / 2**32 * 0.25
    return float(delay * (1 + jitter))
