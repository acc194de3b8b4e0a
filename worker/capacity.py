"""The per-worker caps: how many jobs of each capped kind, and of all kinds together,
this process may still start.

A kind's cap is its `@job(concurrency=N)`, else `default_concurrency`; the process cap is
`--max-concurrency`, else `max_concurrency`. Each queue's own concurrency stays with QueueSlots
(worker/producer.py). The producer alone writes and reads this, on the event loop: `started` when a
claimed job starts, `finished` when its handler ends. The caps are kept by the claim itself (it is
given each capped kind's free slots, less the kind's jobs claimed ahead: worker/ahead.py), never by holding
claimed jobs back in memory until their kind has room: a claimed job is active, its lease running, so one
that waited here for its kind would only look busy and keep the others back.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping


class Capacity:
    def __init__(self, kind_caps: Mapping[str, int], max_concurrency: int | None) -> None:
        self.kind_caps = dict(kind_caps)
        self.max_concurrency = max_concurrency
        self.running: Counter[str] = Counter()  # jobs running per capped kind
        self.total = 0  # jobs running, all kinds
        self.turn = 0  # which queue is served first when the process cap shares slots out (share)

    @property
    def capped(self) -> bool:
        return bool(self.kind_caps)

    def started(self, kind: str) -> None:
        self.total += 1
        if kind in self.kind_caps:
            self.running[kind] += 1

    def finished(self, kind: str, claimed_ahead: int = 0) -> bool:
        """A job of `kind` ended; True when its kind was at its cap, counting its `claimed_ahead` jobs waiting
        for a slot (the claims skipped it, so its queue may have jobs of it pending)."""
        self.total -= 1
        if kind not in self.kind_caps:
            return False
        was_full = self.running[kind] + claimed_ahead >= self.kind_caps[kind]
        self.running[kind] -= 1
        return was_full

    def kind_free(self) -> dict[str, int]:
        """Each capped kind's free slots (0: at its cap), what the claim takes of it at most."""
        return {kind: cap - self.running[kind] for kind, cap in self.kind_caps.items()}

    def total_free(self) -> float:
        return math.inf if self.max_concurrency is None else self.max_concurrency - self.total

    def batch_threshold(self) -> int:
        # Like QueueSlots: once the process is saturated, claim in batches, not one job per freed slot.
        return 1 if self.max_concurrency is None else max(1, self.max_concurrency // 4)

    def share(self, wanted: dict[str, int]) -> dict[str, int]:
        """Trim each queue's wanted count so that together they fit the process cap: the free slots are dealt
        one at a time around the queues, starting one queue further each claim, so no queue starves."""
        free = self.total_free()
        if free >= sum(wanted.values()):
            return wanted
        if free < self.batch_threshold():
            return {}
        names = list(wanted)
        start = self.turn % len(names)
        self.turn += 1
        names = names[start:] + names[:start]
        given = dict.fromkeys(names, 0)
        left = int(free)
        while left > 0:
            dealt = False
            for name in names:
                if left > 0 and given[name] < wanted[name]:
                    given[name] += 1
                    left -= 1
                    dealt = True
            if not dealt:
                break
        return {name: n for name, n in given.items() if n > 0}
