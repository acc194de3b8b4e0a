"""The producer: claims ready jobs for every queue this worker serves and starts them.

One loop and one connection for all queues: each claim is one statement that takes, for each queue
with free slots, at most that many jobs in claim order (store/claim.py, whatever the limits). A queue
is claimed for while it *may have ready jobs* (`QueueSlots.may_have_ready`): a NOTIFY for it, its
timer, a claim that came back full, the start. A claim that comes back short clears that until a
NOTIFY or its timer: the next pending job's run_at (a retry this worker scheduled itself, a delayed
job) or the poll interval, whichever is first.

While a queue's jobs are short it claims beyond its free slots (worker/ahead.py): the extra jobs wait
here and a freed slot starts the next at once.

The per-worker caps (worker/capacity.py) shape each claim: the process cap trims the wanted counts, and
the capped kinds' free slots go into the statement, which skips a kind at its cap and takes no more of a
kind than its free slots. A claim that comes back short after a kind took every free slot it was given
leaves `may_have_ready` set on its queues (the next claim skips that kind if it is at its cap); a job of a
kind that was at its cap sets it on its queue when it ends.

After a claim that came back short, a queue's next walk of the ready index starts (`walk_start`) at that
claim's time less LATE_COMMIT_MARGIN rather than at the head, where a held snapshot keeps an entry for every
job claimed since (store/claim.py CLAIM_JOBS); after a full claim (a backlog), at the run_at of the
last job it took less that margin. It starts there within each priority the queue's claims have met
(`priorities`), and at the head within the others. A job put in line behind that start (committed late,
handed back, recovered, resumed) is told of by its NOTIFY, which carries the earliest run_at of the jobs it
announces (migration 0020): the next walk starts there (`QueueSlots.put_in_line`), also when the NOTIFY
arrives while a claim is on its way. What no NOTIFY tells of is looked for apart from the claims
(`JobsBehind`, store/claim.py JOBS_BEHIND), on the shared connection: in a backlog, older jobs of a lower
priority than the last one taken, at most once every BEHIND_CHECK_INTERVAL (as in a worker that does not
LISTEN); otherwise, for a job that another worker's claim skipped while locked and then left, once every
BEHIND_SAFETY_INTERVAL. A queue where it finds one walks from the head at its next claim. That look visits
every entry a held snapshot keeps, so it runs at most BEHIND_CHECK_SHARE of the time, and never holds up a
claim. While a kind is at its cap its skipped jobs stay behind such a start, so no start is kept then; nor
after a claim that a cluster-wide limit held back, which may leave due jobs of the queue in line (a limit
never reached holds nothing back: its claims walk as fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Literal

import psycopg
from dygo.store.claim import Claim, WalkStart, claim_jobs, claim_session, queues_with_jobs_behind
from dygo.store.leases import ClaimedJob
from dygo.worker.ahead import ClaimAhead
from dygo.worker.capacity import Capacity
from dygo.worker.database import WorkerConnections
from dygo.worker.maintainer import Recovery
from dygo.worker.runs import Runs
from dygo.worker.service import failure_backoff, wait_for_event

RECOVER_INTERVAL = 1.0  # at most this often after a claim, so recovery stays cheap under load
# A job stays unseen by walks that start after its run_at: one enqueued in a transaction that commits this
# much later than it began, or one put back in line by another worker (a hand-back or a recovered lease
# keeps its run_at) waits for the next walk from the head.
LATE_COMMIT_MARGIN = timedelta(seconds=0.5)
# A queue's walk starts past the head within each priority its claims have met, up to this many (store/claim.py
# walk_segments): a segment each. Jobs of further priorities are walked from their head.
KNOWN_PRIORITIES = 8
# A NOTIFY's run_at comes as epoch seconds: a walk starts this much before it, whatever the float rounded.
NOTIFIED_MARGIN = timedelta(milliseconds=1)
BEHIND_CHECK_INTERVAL = 1.0  # the look's pace while a walk start may have left jobs behind that no NOTIFY tells of
BEHIND_SAFETY_INTERVAL = 5.0  # otherwise: for a job a claim skipped while another claim held its lock, then left
# The look for jobs behind the walk starts waits this many times its own last duration before it runs again:
# what it costs the server stays a small share of the time, however many entries a held snapshot keeps.
BEHIND_CHECK_SHARE = 0.05
# A queue a limit held back within this long counts as one whose freed slots are awaited (limit_in_use).
LIMIT_IN_USE_FOR = 5.0


class QueueSlots:
    """One queue's capacity in this process, and whether the producer should claim for it. Read and written
    by the producer only: its loop, and the wake-ups it is told of, on the same event loop."""

    def __init__(self, name: str, concurrency: int, claim_ahead: float, most: int) -> None:
        self.name = name
        self.concurrency = concurrency
        self.running = 0
        self.ahead = ClaimAhead(concurrency, claim_ahead, most)  # jobs claimed beyond the free slots
        # Something says it may have ready jobs (a NOTIFY, its timer, a full claim, the start): claim for it
        # when enough is `claimable`. Cleared by a claim, set again by whatever says so next.
        self.may_have_ready = True
        # Monotonic time its timer sets may_have_ready (inf: no timer).
        self.due_at = math.inf
        # The run_at its next walk of the ready index starts at (None: at the head), past the entries a held
        # snapshot keeps for jobs claimed since; see the module docstring.
        self.walk_start: datetime | None = None
        # The priorities its claims have met (at most KNOWN_PRIORITIES): within each, a walk starts at walk_start.
        self.priorities: set[int] = set()
        # A claim walked from its walk_start since the last look for jobs behind it began (JobsBehind): one
        # is due. A walk from the head sees everything, so it clears this.
        self.unchecked = False
        # Monotonic time a full claim last set walk_start (-inf: none since a walk from the head or a look
        # that found nothing): jobs of lower priorities than its last may wait behind it, told of by no NOTIFY.
        self.backlog_at = -math.inf
        # The starts NOTIFYs asked for while a claim was on its way (None: no claim is): its snapshot may have
        # missed their jobs, so its result moves walk_start past none of them.
        self.notified_in_claim: list[datetime] | None = None
        self.held_at = -math.inf  # monotonic time of its last claim a limit held back

    def met(self, priorities: set[int]) -> None:
        """A claim took jobs of these priorities: known from now on, up to KNOWN_PRIORITIES."""
        self.priorities.update(sorted(priorities - self.priorities)[: KNOWN_PRIORITIES - len(self.priorities)])

    def put_in_line(self, run_at: datetime) -> None:
        """A NOTIFY says jobs of this queue became pending from `run_at` on: the next walk starts no later."""
        start = run_at - NOTIFIED_MARGIN
        self.walk_start = earlier(self.walk_start, start)
        if self.notified_in_claim is not None:
            self.notified_in_claim.append(start)

    def claim_sent(self) -> None:
        self.notified_in_claim = []

    def claim_returned(self, start: datetime | None | Literal[False]) -> None:
        """A claim came back: its next walk starts at `start` (False: where it was), or earlier where a job it
        may have missed was put in line meanwhile."""
        if start is not False:
            self.walk_start = start
        for notified in self.notified_in_claim or ():
            self.walk_start = earlier(self.walk_start, notified)
        self.notified_in_claim = None

    def walk_start_at(self) -> WalkStart | None:
        """Where its next walk starts (None: at the head)."""
        return None if self.walk_start is None else WalkStart(self.walk_start, frozenset(self.priorities))

    @property
    def free(self) -> int:
        """Its slots not running a job."""
        return self.concurrency - self.running

    @property
    def claimable(self) -> int:
        """How many more jobs it may claim now: its free slots, plus what it may hold ahead beyond them."""
        return self.concurrency + self.ahead.may_hold() - self.running - len(self.ahead)

    def batch_threshold(self) -> int:
        # Claim in batches once saturated, not one job per freed slot.
        return max(1, (self.concurrency + self.ahead.may_hold()) // 4)


def earlier(start: datetime | None, other: datetime) -> datetime | None:
    """The earlier of two walk starts (None: the head, before every other)."""
    return None if start is None else min(start, other)


class Producer:
    name = "producer"

    def __init__(
        self,
        database: WorkerConnections,
        slots: dict[str, QueueSlots],
        runs: Runs,
        recovery: Recovery,
        worker_id: str,
        lease_ttl: float,
        batch_size: int,
        poll_interval: float,
        capacity: Capacity | None = None,
        notified: bool = True,
    ) -> None:
        self.database = database
        self.notified = notified  # its listener LISTENs: a job put in line behind a walk start is told of
        self.slots = slots
        self.capacity = capacity or Capacity({}, None)
        self.runs = runs
        self.recovery = recovery
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.wake = asyncio.Event()  # a NOTIFY, a freed slot, or stop
        self.stopping = asyncio.Event()
        self.conn: psycopg.AsyncConnection | None = None  # the claim connection (worker/database.py)
        # A worker recovers expired leases before it claims: its first claim after start and after an
        # outage follows a recovery pass; afterwards recovery follows claims, off the wake-up path.
        self.recover_first = True
        # Queues the last claim held back on a cluster-wide limit: seconds until worth claiming again.
        self.held_back: dict[str, float] = {}
        # What the per-worker caps did to the last claim: some capped kind took every free slot it was given
        # (capped_kind_filled), or had none and was skipped (capped_kind_skipped). Judged from what the claim
        # was given, not from the caps after it: a job of the kind that ended during the claim had freed a slot
        # it could not see.
        self.capped_kind_filled = False
        self.capped_kind_skipped = False
        self.behind = JobsBehind(self)

    # --- signals, from the listener, finished jobs, the settler (QueueWakeups) and the worker ---------

    def wake_queue(self, name: str, run_at: datetime | None = None) -> None:
        """Queue `name` may have ready jobs; a NOTIFY's `run_at` says where in line they start."""
        slots = self.slots.get(name)
        if slots is not None:
            slots.may_have_ready = True
            if run_at is not None:
                slots.put_in_line(run_at)
            self.wake.set()

    def wake_all(self) -> None:
        for slots in self.slots.values():
            slots.may_have_ready, slots.walk_start = True, None  # what was missed meanwhile may sit anywhere in line
        self.wake.set()

    def finished(self, job: ClaimedJob, took: float) -> None:
        slots = self.slots[job.queue]
        slots.running -= 1
        slots.ahead.ended(took)
        claimed_ahead = self._claimed_ahead(job.kind) if job.kind in self.capacity.kind_caps else 0
        if self.capacity.finished(job.kind, claimed_ahead):
            # Its kind was skipped while at its cap: jobs of it may be waiting, anywhere in line.
            slots.may_have_ready, slots.walk_start = True, None
        if not self.stopping.is_set() and (waiting := slots.ahead.next()) is not None:
            self._start(waiting)  # a job claimed ahead takes the freed slot: no round trip between the two
        self.wake.set()

    def requeued(self, name: str, delay: float) -> None:
        """This worker put a job of `name` back, due in `delay` seconds: claim for the queue then."""
        slots = self.slots.get(name)
        if slots is not None:
            slots.due_at = min(slots.due_at, time.monotonic() + max(delay, 0.0) + 0.005)
            slots.walk_start = None  # a hand-back keeps its run_at: behind where the walk would start
            self.wake.set()  # the idle wait takes the new timer into account

    def limit_in_use(self, name: str) -> bool:
        """Whether a limit held back a claim of queue `name` within LIMIT_IN_USE_FOR (QueueWakeups)."""
        slots = self.slots.get(name)
        return slots is not None and time.monotonic() - slots.held_at < LIMIT_IN_USE_FOR

    def claims_freed_slots(self, name: str) -> bool:
        """Whether this worker claims for queue `name` as soon as it is told a settle freed a slot of a
        limit there (limit_slots_freed): then the settle need not wake every worker to race for the slot
        under the limit's lock (limits.freed_queues); the workers a limit held back still retry on their
        timer."""
        slots = self.slots.get(name)
        return (
            slots is not None
            and not self.stopping.is_set()
            and slots.free >= slots.batch_threshold()
            and self.capacity.total_free() >= self.capacity.batch_threshold()
        )

    def limit_slots_freed(self, names: list[str]) -> None:
        """A settle of this worker freed slots of a limit in `names` (committed): claim for them now."""
        for name in names:
            self.wake_queue(name)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    # --- the loop ------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._produce()
        finally:
            await self.behind.cancel()
            waiting = [job for slots in self.slots.values() for job in slots.ahead.release()]
            if waiting:
                self.runs.hand_back(waiting, "claimed-ahead", "not started before the stop")
            if self.conn is not None:
                await self.conn.close()
                self.conn = None

    async def _produce(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            self.wake.clear()
            self._hand_back_stale()
            self.behind.start_if_due()
            wanted = self._wanted()
            if not wanted:
                await wait_for_event(self.wake, self._until_next_timer())
                continue
            reused = self.conn is not None
            try:
                if self.conn is None:
                    self.conn = await self.database.connect()
                    await claim_session(self.conn)
                if self.recover_first or self.database.outage.down:
                    await self.recovery.run_once()
                    self.recover_first = False
                for name in wanted:  # a NOTIFY during the claim sets it again
                    self.slots[name].may_have_ready = False
                    self.slots[name].claim_sent()
                claim = await self.claim(self.conn, wanted, self._walk_starts(wanted))
                failures = 0
                await self.database.back()
                # Recovery comes right after a claim rather than before it, to keep its round trip
                # off the path from a wake-up to a started job; what it recovers wakes us again. Not while
                # the look behind the walk starts holds the shared connection: the claims would wait for it.
                if time.monotonic() - self.recovery.last >= RECOVER_INTERVAL and self.behind.task is None:
                    await self.recovery.run_once()
                counts = Counter(job.queue for job in claim.jobs)
                short = [name for name, n in wanted.items() if counts[name] < n and name not in self.held_back]
                # Rows of a capped kind, or that a limit held back, may be left in line: no walk starts past them.
                every_kind_taken = not (self.capped_kind_filled or self.capped_kind_skipped)
                for name, n in wanted.items():
                    slots = self.slots[name]
                    every_due_taken = every_kind_taken and name not in claim.held_back
                    start: datetime | Literal[False] = False  # where it was
                    if counts[name] == n:
                        slots.may_have_ready = True  # there may be more ready right now
                        if name in claim.last_run_at and every_due_taken:
                            # A backlog: the next walk starts about where this one stopped, not at the head
                            # across the entries of every job claimed since a held snapshot began.
                            start = claim.last_run_at[name] - LATE_COMMIT_MARGIN
                            slots.backlog_at = time.monotonic()
                    elif claim.clock is not None and every_due_taken:
                        # Every job due and visible then was taken.
                        start = claim.clock - LATE_COMMIT_MARGIN
                    slots.claim_returned(start)
                self._hold(self.held_back)
                if short and self.capped_kind_filled:
                    # A kind took all its free slots in this claim, so rows of it may be left behind (or it
                    # took the place of others): claim again, skipping it if it is at its cap now. Not when
                    # it ended short because the kind was at its cap when it began: that kind's next end
                    # marks the queue (`finished`), and claiming again would find it still at its cap.
                    for name in short:
                        self.slots[name].may_have_ready = True
                elif short:
                    self._set_timers(short, claim.due_in)
            except (psycopg.Error, OSError) as exc:
                self.recover_first = True
                for name in wanted:
                    self.slots[name].may_have_ready = True
                    self.slots[name].claim_returned(None)
                if self.conn is not None:
                    await self.conn.close()
                    self.conn = None
                if reused:
                    # A connection left idle through a database restart fails on its first use after
                    # it: a fresh one decides, at once, whether the database is really away.
                    continue
                failures += 1
                await self.database.failed(f"claim from queue(s) {', '.join(wanted)}", exc)
                # The listener's reconnect (wake_all) ends the wait: the database, or a new primary, is back.
                await wait_for_event(self.wake, failure_backoff(failures))

    def _wanted(self) -> dict[str, int]:
        """How many jobs to claim per queue now: queues that may have ready jobs and have enough room."""
        now = time.monotonic()
        wanted = {}
        for slots in self.slots.values():
            if slots.due_at <= now:
                slots.may_have_ready, slots.due_at = True, math.inf
            if slots.may_have_ready and slots.claimable >= slots.batch_threshold():
                wanted[slots.name] = min(slots.claimable, self.batch_size)
        return self.capacity.share(wanted) if wanted else wanted

    def _walk_starts(self, wanted: dict[str, int]) -> dict[str, WalkStart]:
        """Where each queue's walk starts: its `walk_start` within its known priorities (left out: the head)."""
        starts = {}
        for name in wanted:
            slots = self.slots[name]
            start = slots.walk_start_at()
            slots.unchecked = start is not None
            if start is not None:
                starts[name] = start
            else:
                slots.backlog_at = -math.inf  # a walk from the head sees everything
        return starts

    def _hold(self, held_back: dict[str, float]) -> None:
        """Queues a limit held back claim again when it may admit more (their ready jobs are due already,
        so the next-run timer would spin); a settle's NOTIFY may wake them sooner."""
        now = time.monotonic()
        for name, wait in held_back.items():
            self.slots[name].held_at = now
            if wait <= 0:
                self.slots[name].may_have_ready = True
            else:
                self.slots[name].due_at = min(self.slots[name].due_at, now + min(wait, self.poll_interval))

    def _until_next_timer(self) -> float:
        due = min((s.due_at for s in self.slots.values()), default=math.inf)
        wait = self.poll_interval if due == math.inf else max(0.0, due - time.monotonic())
        return min([wait, self.behind.due_in(), *(s.ahead.due_in() for s in self.slots.values())])

    def _hand_back_stale(self) -> None:
        """Jobs claimed ahead go back to the queue when its slots stopped freeing, for another worker to run
        now."""
        for slots in self.slots.values():
            stale = slots.ahead.stale()
            if stale:
                self.runs.hand_back(
                    stale, "claimed-ahead", f"no slot of queue {slots.name} freed for {slots.ahead.hand_back_after:g}s"
                )

    def _set_timers(self, queues: list[str], due: dict[str, float]) -> None:
        """Set each queue's timer: when its next scheduled job is due (the claim said when), or after the poll
        interval."""
        now = time.monotonic()
        for name in queues:
            slots = self.slots[name]
            wait = self.poll_interval
            if name in due:
                wait = min(wait, max(due[name], 0.0) + 0.005)
            slots.due_at = now + wait

    async def claim(
        self,
        conn: psycopg.AsyncConnection,
        wanted: dict[str, int],
        walk_starts: dict[str, WalkStart] | None = None,
    ) -> Claim:
        """Claim up to wanted[queue] jobs per queue (store/claim.py) and start them."""
        kind_free = self._kind_free() if self.capacity.capped else None
        # Jobs claimed ahead already waiting here take the next free slots: beyond the rest, a job is claimed ahead.
        free = {name: max(self.slots[name].free - len(self.slots[name].ahead), 0) for name in wanted}
        claim = await claim_jobs(
            conn, wanted, self.worker_id, self.lease_ttl, starts=walk_starts, kind_free=kind_free, free=free
        )
        for name, priorities in claim.priorities.items():
            self.slots[name].met(priorities)
        self.held_back = claim.held_back
        taken = Counter(job.kind for job in claim.jobs)
        given = kind_free or {}
        self.capped_kind_filled = any(0 < free <= taken[kind] for kind, free in given.items())
        self.capped_kind_skipped = any(free <= 0 for free in given.values())
        # The process cap counts started jobs across the queues: under it, no job waits here. A cluster-wide
        # limit counts a job claimed ahead as running, and admits one only with room to spare (store/claim.py).
        for name in wanted:
            self.slots[name].ahead.allowed = self.capacity.max_concurrency is None
        starting = []
        for job in claim.jobs:
            slots = self.slots[job.queue]
            if slots.running < slots.concurrency:
                self._take_slot(job)
                starting.append(job)
            else:
                slots.ahead.hold(job)
                self.runs.hold(job)
        if starting:
            self.runs.start(starting, self.finished)
        return claim

    def _kind_free(self) -> dict[str, int]:
        """Each capped kind's free slots less its jobs claimed ahead: a waiting job takes its kind's slot when
        it starts, so a kind never runs more than its cap."""
        return {kind: free - self._claimed_ahead(kind) for kind, free in self.capacity.kind_free().items()}

    def _claimed_ahead(self, kind: str) -> int:
        """Jobs of `kind` waiting for a slot, in all queues."""
        return sum(slots.ahead.kinds[kind] for slots in self.slots.values())

    def _start(self, job: ClaimedJob) -> None:
        self._take_slot(job)
        self.runs.start([job], self.finished)

    def _take_slot(self, job: ClaimedJob) -> None:
        self.slots[job.queue].running += 1
        self.capacity.started(job.kind)


class JobsBehind:
    """The look for ready jobs behind the queues' walk starts (store/claim.py JOBS_BEHIND), apart from the
    claims: a task of its own on the shared connection, so a claim never waits for it (the producer leaves its
    recovery pass for later while it runs). A queue where it finds one gets its next claim from the head at
    once; one it cannot tell about (the database failed) too. Its pace: see the module docstring."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.task: asyncio.Task[None] | None = None
        self.ended = time.monotonic()  # when the last look ended (the producer's start before the first)
        self.took = 0.0  # seconds the last look took

    def _waiting(self) -> dict[str, datetime]:
        """The queues to look at: a claim walked from their start since the last look began."""
        return {s.name: s.walk_start for s in self.producer.slots.values() if s.unchecked and s.walk_start is not None}

    def _interval(self, starts: dict[str, datetime]) -> float:
        """The pace of the looks at these queues: slower when a NOTIFY tells of every job put behind them."""
        told = self.producer.notified and all(self.producer.slots[name].backlog_at == -math.inf for name in starts)
        return BEHIND_SAFETY_INTERVAL if told else BEHIND_CHECK_INTERVAL

    def _next_at(self, interval: float) -> float:
        """Monotonic time the next look may begin at this pace."""
        return self.ended + max(interval - self.took, self.took / BEHIND_CHECK_SHARE)

    def due_in(self) -> float:
        """Seconds until a look is due (inf: none is)."""
        if self.task is not None or not (starts := self._waiting()):
            return math.inf
        return max(0.0, self._next_at(self._interval(starts)) - time.monotonic())

    def start_if_due(self) -> None:
        # Called on every turn of the producer's loop: the faster pace's time is checked before the queues are.
        if self.task is not None or self.producer.stopping.is_set():
            return
        if time.monotonic() < self._next_at(BEHIND_CHECK_INTERVAL):
            return
        starts = self._waiting()
        if not starts or time.monotonic() < self._next_at(self._interval(starts)):
            return
        for name in starts:
            self.producer.slots[name].unchecked = False
        self.task = asyncio.create_task(self._look(starts))

    async def _look(self, starts: dict[str, datetime]) -> None:
        began = time.monotonic()
        behind = set(starts)  # unless the look says otherwise
        try:
            async with self.producer.database.connection() as conn:
                behind = await queues_with_jobs_behind(conn, starts)
        except (psycopg.Error, OSError):
            pass  # the database is away: the claims find out and say so
        finally:
            self.ended = time.monotonic()
            self.took = self.ended - began
            for name in starts:
                slots = self.producer.slots[name]
                if name in behind:
                    slots.may_have_ready, slots.walk_start = True, None
                elif slots.backlog_at < began:
                    slots.backlog_at = -math.inf  # nothing behind the start a backlog left
            self.task = None
            self.producer.wake.set()  # its next look may be due, or a queue walks from the head

    async def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
