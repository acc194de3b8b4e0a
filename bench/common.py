"""What every benchmark script shares: the plan, the result record, timing, processes, CPU accounting.

Imported by `run.py` and `dygo_bench.py` (dygo's .venv) and by the peer scripts (`.venv-bench`),
so it needs nothing beyond the standard library and psycopg, which both interpreters have.

Every script measures the same four things the same way:

1. enqueue one at a time: N jobs, one call and one commit per job, one connection;
2. enqueue batched: N jobs in batches through the system's own bulk API;
3. processing: a worker process (a real subprocess, the system's own CLI) is idle and warm;
   `process_jobs` no-op jobs are enqueued in one transaction; the rate is
   jobs / (last settle - first claim), both read from the database rows;
4. latency: with the same idle worker, `latency_jobs` jobs are enqueued one at a time
   `latency_interval` apart; latency = start time - enqueue time, both from the rows.

Database timestamps are `now()` of the writing transaction on every system, so the figures
are comparable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
OUTPUT_DIR = ROOT / ".dygo" / "bench"  # profiles; .dygo/ is git-ignored


# --- the plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    url: str  # the system's own database
    one_jobs: int = 5_000
    batched_jobs: int = 50_000
    batch_size: int = 5_000
    enqueue_rounds: int = 3  # each enqueue figure is the median of this many rounds
    process_jobs: int = 10_000
    process_rounds: int = 3
    latency_jobs: int = 200
    latency_interval: float = 0.020
    timeout: float = 180.0  # per wait; a stuck worker fails the run instead of hanging it


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Plan(url="")
    parser.add_argument("--url", required=True, help="connection URL of this system's (empty) database")
    parser.add_argument("--one-jobs", type=int, default=defaults.one_jobs)
    parser.add_argument("--batched-jobs", type=int, default=defaults.batched_jobs)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--enqueue-rounds", type=int, default=defaults.enqueue_rounds)
    parser.add_argument("--process-jobs", type=int, default=defaults.process_jobs)
    parser.add_argument("--process-rounds", type=int, default=defaults.process_rounds)
    parser.add_argument("--latency-jobs", type=int, default=defaults.latency_jobs)
    parser.add_argument("--latency-interval", type=float, default=defaults.latency_interval)
    parser.add_argument("--timeout", type=float, default=defaults.timeout)


def plan_from(args: argparse.Namespace) -> Plan:
    return Plan(**{name: getattr(args, name) for name in Plan.__dataclass_fields__})


def plan_arguments(plan: Plan) -> list[str]:
    """The command-line flags that give a script `plan` (run.py passes them on)."""
    flags: list[str] = []
    for name, value in asdict(plan).items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


# --- results ----------------------------------------------------------------------------------------


@dataclass
class ProcessingRound:
    jobs: int
    seconds: float  # last settle - first claim, from the rows
    rate: float
    worker_cpu_seconds: float  # CPU the worker process used during the round
    postgres_cpu_seconds: float  # CPU the PostgreSQL server processes used during the round
    machine_busy_seconds: float  # CPU all processes used (both cores): worker + PostgreSQL + this script


@dataclass
class Result:
    system: str
    version: str
    settings: str  # how the worker and the enqueues were configured
    enqueue_one: float = 0.0  # jobs/s, median of the rounds
    enqueue_batched: float = 0.0  # jobs/s, median of the rounds
    processed: float = 0.0  # jobs/s, median of the rounds
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    enqueue_one_rounds: list[float] = field(default_factory=list)
    enqueue_batched_rounds: list[float] = field(default_factory=list)
    rounds: list[ProcessingRound] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)  # every latency sample, so passes can be pooled
    notes: list[str] = field(default_factory=list)
    profile: dict[str, Any] | None = None

    def record_latency(self, samples_ms: Sequence[float]) -> None:
        self.latency_ms = [round(x, 4) for x in samples_ms]
        self.p50_ms, self.p95_ms, self.p99_ms = percentiles(samples_ms)
        log(
            f"{self.system}: latency over {len(samples_ms)} jobs p50 {self.p50_ms:.2f} ms, p95 {self.p95_ms:.2f} ms, "
            f"p99 {self.p99_ms:.2f} ms"
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Result:
        data = json.loads(text)
        data["rounds"] = [ProcessingRound(**r) for r in data.get("rounds", [])]
        return cls(**data)


def emit(result: Result) -> None:
    """The last line a benchmark script prints on stdout is its result; run.py reads it."""
    print(result.to_json(), flush=True)


def log(message: str) -> None:
    """Progress goes to stderr, so stdout stays the result."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentiles(values_ms: Sequence[float]) -> tuple[float, float, float]:
    """p50, p95, p99 by the nearest-rank method."""
    ordered = sorted(values_ms)
    return percentile(ordered, 50), percentile(ordered, 95), percentile(ordered, 99)


def percentile(ordered: Sequence[float], p: float) -> float:
    """The nearest-rank p-th percentile of `ordered` (sorted)."""
    if not ordered:
        return float("nan")
    return ordered[max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


def median_round(rounds: Sequence[ProcessingRound]) -> float:
    return statistics.median(r.rate for r in rounds) if rounds else 0.0


def enqueue_rates(system: str, what: str, jobs: int, seconds: Sequence[float]) -> tuple[float, list[float]]:
    """The median rate of the enqueue rounds, and every round's rate; logs them."""
    rates = [rate(jobs, s) for s in seconds]
    log(f"{system}: enqueue {what}: {jobs} jobs per round, {', '.join(f'{r:,.0f}' for r in rates)} jobs/s")
    return statistics.median(rates), rates


# --- timing ------------------------------------------------------------------------------------------


def rate(jobs: int, seconds: float) -> float:
    return jobs / seconds if seconds > 0 else float("inf")


def wait_until(done: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def migrate(env: dict[str, str]) -> None:
    """`dygo migrate` with these variables (DATABASE_URL names the database) added to the environment."""
    subprocess.run(
        [sys.executable, "-m", "dygo", "migrate"],
        env={**os.environ, **env},
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def paced(count: int, interval: float) -> Iterator[int]:
    """Yield 0..count-1, the i-th at start + i * interval (no drift from the work in between)."""
    start = time.perf_counter()
    for i in range(count):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


# --- CPU accounting (Linux /proc) ---------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of one process; 0 where /proc is unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15)


def machine_busy_seconds() -> float:
    """CPU seconds spent not idle on all cores since boot."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def server_cpu_seconds(postmaster: int) -> dict[int, float]:
    """CPU of one PostgreSQL server's processes (postmaster, backends, background workers), by pid.

    Filtered by parent so another server on the machine (a test suite's) is not counted.
    """
    found = {postmaster: process_cpu_seconds(postmaster)}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if parent_pid(int(entry.name)) == postmaster:
                    found[int(entry.name)] = process_cpu_seconds(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


@dataclass
class CpuMeter:
    """CPU used between start() and stop() by one process, by a PostgreSQL server, and by the machine.

    The server's share counts its processes alive at stop(); the benchmark keeps its connections
    open, so only short-lived ones (an autovacuum worker) can be missed.
    """

    pid: int
    postmaster: int  # parent of every backend: parent_pid(connection's backend pid)
    worker: float = 0.0
    postgres: float = 0.0
    machine: float = 0.0
    _postgres_before: dict[int, float] = field(default_factory=dict)

    def start(self) -> CpuMeter:
        self.worker, self.machine = -process_cpu_seconds(self.pid), -machine_busy_seconds()
        self._postgres_before = server_cpu_seconds(self.postmaster)
        return self

    def stop(self) -> CpuMeter:
        self.worker += process_cpu_seconds(self.pid)
        self.machine += machine_busy_seconds()
        after = server_cpu_seconds(self.postmaster)
        self.postgres = sum(cpu - self._postgres_before.get(pid, 0.0) for pid, cpu in after.items())
        return self


# --- worker subprocesses -------------------------------------------------------------------------------


class WorkerProcess:
    """A worker started with its own CLI; its output is kept in memory for the error message."""

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.command = list(command)
        self._tail = b""
        self.process = subprocess.Popen(
            self.command,
            env={**os.environ, **(env or {})},
            cwd=cwd or ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        # In large chunks, keeping only the tail: a worker at 10,000 jobs/s writes 10,000 lines a second,
        # and reading them one by one in Python took CPU from the benchmark's own process (2 cores).
        assert self.process.stdout is not None
        while chunk := self.process.stdout.read1(1 << 16):
            self._tail = (self._tail + chunk)[-(1 << 16) :]

    @property
    def output(self) -> list[str]:
        """The last lines the worker printed."""
        return self._tail.decode(errors="replace").splitlines()[-200:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            tail = "\n".join(self.output[-30:])
            raise RuntimeError(f"worker {' '.join(self.command)} exited with {self.process.returncode}:\n{tail}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        return self.process.returncode

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


# Sessions of this benchmark's database other than the caller's own: a worker left running from an earlier run
# (or another person's) would take a share of the jobs and halve the measured CPU per job.
OTHER_CLIENTS = """SELECT pid, coalesce(nullif(application_name, ''), 'no application name') FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"""


def refuse_other_clients(rows: Sequence[Sequence[Any]], system: str) -> None:
    """Stop the run, naming them, if OTHER_CLIENTS found any (`rows`: its result, from whichever driver)."""
    others = [f"pid {pid} ({name})" for pid, name in rows]
    if others:
        raise SystemExit(
            f"{system}: other clients are connected to this benchmark's database and would take its "
            f"jobs: {', '.join(others)}. Stop them (a worker left from an earlier run?) and run again."
        )


def wait_for_rows(
    count_done: Callable[[], int], expected: int, worker: WorkerProcess, timeout: float, what: str
) -> None:
    """Poll (lightly: this script shares the two cores) until `expected` jobs are settled."""

    def done() -> bool:
        worker.check_alive()
        return count_done() >= expected

    wait_until(done, timeout, f"{expected} {what}", interval=0.2)


# --- profiles (py-spy --format raw: "func (pkg/module.py);func (...);... count" lines) ------------------------


@contextlib.contextmanager
def py_spy(py_spy_binary: str | None, pid: int, output: Path, rate_hz: int = 500) -> Iterator[None]:
    """Sample `pid` with py-spy while the block runs; no-op without a py-spy binary."""
    if not py_spy_binary:
        yield
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    recorder = subprocess.Popen(
        [
            py_spy_binary,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate_hz),
            "--format",
            "raw",
            "--output",
            str(output),
            "--nonblocking",
            "--nolineno",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # let it attach
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        try:
            _, errors = recorder.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            _, errors = recorder.communicate()
        if not output.exists():
            log(f"py-spy wrote no profile ({recorder.returncode}): {errors.strip()[-500:]}")


PROJECT_DIRS = ("store/", "worker/", "jobs/")  # not dygo/: its CLI frames are under every sample


def summarise_profile(raw: Path, top: int = 15) -> dict[str, Any]:
    """Top functions by own time (leaf frames, any code) and by total time (dygo's own functions only:
    the frames above them are the event loop, the same in every sample)."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            if any(f"({d}" in frame for d in PROJECT_DIRS):
                total[frame] = total.get(frame, 0) + count

    def ranked(table: dict[str, int]) -> list[tuple[str, float]]:
        best = sorted(table.items(), key=lambda item: item[1], reverse=True)[:top]
        return [(name, round(100 * count / samples, 1)) for name, count in best]

    return {"samples": samples, "own": ranked(own), "total": ranked(total), "raw": str(raw)}
