"""HTTP enqueue: `dygo serve` against a bare reference endpoint, side by side, with `hey` as the load.

Not named bench/http.py: scripts run from bench/ have it first on sys.path, where an http.py
shadows the standard library's `http` package (httpx, uvicorn and urllib.request import it).

    .venv/bin/python bench/http_bench.py                       # = make bench-http (about 3 minutes)
    .venv/bin/python bench/http_bench.py --seconds 2 --concurrency 1 16 --markdown

One fresh database (`bench_http`, migrated) on the embedded server (or --server-url). Two servers,
each a real process on 127.0.0.1, started the same way (uvicorn, dygo's logging, access lines on):

- dygo: `dygo serve` (bearer tokens configured, as in production; default serve_pool_size 10);
- reference: bench/http_reference.py, FastAPI + psycopg AsyncConnectionPool (as many connections
  as dygo's hot pool) + store/sql/enqueue.py's INSERT_JOB, the statement dygo's single enqueue runs.

For each endpoint (POST /api/v1/jobs with one job; POST /api/v1/jobs/batch with --batch jobs) and
each concurrency, `hey` runs --seconds against each server in turn (reference, dygo, reference, dygo:
--rounds rounds each, interleaved so that drift on a shared machine hits both), after a short warm-up,
with the job table truncated before each run. A line gives jobs/s (the median of the rounds), p50
and p99 request latency (of the median round), errors (every answer that is not a 2xx, and every
transport error, over all rounds) and the server process's CPU time per job (user + system from
/proc/<pid>/stat around each run, median of the rounds: less moved by other work on the machine than
jobs/s, though not immune); dygo's line also gives its share of the reference's jobs/s.
The target (issue 12): dygo >= 80% of the reference at every concurrency, 0 errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from common import ROOT, log, wait_until
from run import embedded_server_url, fresh_database

TOKEN = "bench-http-admin-token-0123456789"
TARGET_SHARE = 0.80


@dataclass
class Run:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_seconds: float  # the server process's CPU time during the run


@dataclass
class Line:
    endpoint: str  # "one" or "batch"
    concurrency: int
    server: str  # "dygo" or "reference"
    jobs_per_request: int
    jobs_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    rounds: list[float]  # jobs/s of each round
    cpu_us_per_job: float  # the server's CPU time per job (median of the rounds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, command: list[str], env: dict[str, str], port: int) -> None:
        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-http-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True
        )

        def up() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_until(up, 30, f"{name} to listen on {port}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (one process: WEB_CONCURRENCY is unset)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_servers(url: str, pool_size: int) -> tuple[Server, Server, dict[str, str]]:
    sys.path.insert(0, str(ROOT))
    from dygo.app.db import split_pool

    env = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_") and k != "WEB_CONCURRENCY"}
    env.update(DATABASE_URL=url, DYGO_ADMIN_TOKEN=TOKEN, PYTHONPATH=str(ROOT), DYGO_SERVE_POOL_SIZE=str(pool_size))
    dygo_port, reference_port = free_port(), free_port()
    dygo = Server("dygo", [sys.executable, "-m", "dygo", "serve", "--port", str(dygo_port)], env, dygo_port)
    hot, _ = split_pool(pool_size)
    reference = Server(
        "reference",
        [
            sys.executable,
            str(ROOT / "bench" / "http_reference.py"),
            "--url",
            url,
            "--port",
            str(reference_port),
            "--pool-size",
            str(hot),
        ],
        env,
        reference_port,
    )
    paths = {
        "dygo one": f"http://127.0.0.1:{dygo_port}/api/v1/jobs",
        "dygo batch": f"http://127.0.0.1:{dygo_port}/api/v1/jobs/batch",
        "reference one": f"http://127.0.0.1:{reference_port}/jobs",
        "reference batch": f"http://127.0.0.1:{reference_port}/jobs/batch",
    }
    return dygo, reference, paths


def hey(url: str, body: Path, concurrency: int, seconds: float, token: str | None, server: Server | None = None) -> Run:
    command = [
        "hey",
        "-z",
        f"{seconds}s",
        "-c",
        str(concurrency),
        "-m",
        "POST",
        "-T",
        "application/json",
        "-D",
        str(body),
        "-t",
        "30",
    ]
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    cpu = server.cpu_seconds() if server else 0.0
    out = subprocess.run([*command, url], capture_output=True, text=True, timeout=seconds + 90).stdout
    cpu = server.cpu_seconds() - cpu if server else float("nan")
    codes = {int(code): int(n) for code, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    transport = sum(
        int(n) for n, rest in re.findall(r"^\s+\[(\d+)\]\s+(.*)$", out, re.M) if not re.match(r"\d+ responses", rest)
    )
    total = re.search(r"Total:\s+([\d.]+) secs", out)
    p50 = re.search(r"50% in ([\d.]+) secs", out)
    p99 = re.search(r"99% in ([\d.]+) secs", out)
    ok = sum(n for code, n in codes.items() if 200 <= code < 300)
    return Run(
        requests=ok,
        seconds=float(total.group(1)) if total else seconds,
        p50_ms=float(p50.group(1)) * 1000 if p50 else float("nan"),
        p99_ms=float(p99.group(1)) * 1000 if p99 else float("nan"),
        errors=sum(n for code, n in codes.items() if not 200 <= code < 300) + transport,
        cpu_seconds=cpu,
    )


def truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE dygo_jobs")


def measure(
    args: argparse.Namespace, url: str, paths: dict[str, str], bodies: dict[str, Path], servers: dict[str, Server]
) -> list[Line]:
    lines: list[Line] = []
    for endpoint in args.endpoints:
        per_request = 1 if endpoint == "one" else args.batch
        for concurrency in args.concurrency:
            runs: dict[str, list[Run]] = {"reference": [], "dygo": []}
            for server in ("reference", "dygo"):  # warm-up: connections opened, code paths hot
                hey(paths[f"{server} {endpoint}"], bodies[endpoint], concurrency, 1, TOKEN)
            for _ in range(args.rounds):
                for server in ("reference", "dygo"):
                    truncate(url)
                    run = hey(
                        paths[f"{server} {endpoint}"],
                        bodies[endpoint],
                        concurrency,
                        args.seconds,
                        TOKEN,
                        servers[server],
                    )
                    runs[server].append(run)
                    log(
                        f"{endpoint:5} c={concurrency:<3} {server:9} {run.requests * per_request / run.seconds:9,.0f} "
                        f"jobs/s  p50 {run.p50_ms:7.1f} ms  p99 {run.p99_ms:7.1f} ms  errors {run.errors}  "
                        f"cpu {_cpu_per_job(run, per_request):5.0f} us/job"
                    )
            for server, done in runs.items():
                rates = [r.requests * per_request / r.seconds for r in done]
                middle = sorted(done, key=lambda r: r.requests * per_request / r.seconds)[len(done) // 2]
                lines.append(
                    Line(
                        endpoint,
                        concurrency,
                        server,
                        per_request,
                        statistics.median(rates),
                        middle.p50_ms,
                        middle.p99_ms,
                        sum(r.errors for r in done),
                        [round(r, 1) for r in rates],
                        statistics.median(_cpu_per_job(r, per_request) for r in done),
                    )
                )
    return lines


def _cpu_per_job(run: Run, per_request: int) -> float:
    """Microseconds of server CPU per job enqueued (answered 2xx) in the run."""
    jobs = run.requests * per_request
    return run.cpu_seconds / jobs * 1e6 if jobs else float("nan")


def table(lines: list[Line], markdown: bool) -> str:
    header = [
        "endpoint",
        "clients",
        "server",
        "jobs/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "server CPU us/job",
        "dygo / reference",
    ]
    reference = {(line.endpoint, line.concurrency): line.jobs_per_s for line in lines if line.server == "reference"}
    rows = []
    for line in lines:
        share = ""
        if line.server == "dygo" and reference.get((line.endpoint, line.concurrency)):
            share = f"{line.jobs_per_s / reference[(line.endpoint, line.concurrency)]:.0%}"
        name = "POST /jobs (1 job)" if line.endpoint == "one" else f"POST /jobs/batch ({line.jobs_per_request} jobs)"
        rows.append(
            [
                name,
                str(line.concurrency),
                line.server,
                f"{line.jobs_per_s:,.0f}",
                f"{line.p50_ms:.1f}",
                f"{line.p99_ms:.1f}",
                str(line.errors),
                f"{line.cpu_us_per_job:,.0f}",
                share,
            ]
        )
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows])


def verdict(lines: list[Line]) -> str:
    reference = {(line.endpoint, line.concurrency): line.jobs_per_s for line in lines if line.server == "reference"}
    misses = []
    for line in lines:
        if line.server != "dygo":
            continue
        share = line.jobs_per_s / reference[(line.endpoint, line.concurrency)]
        if share < TARGET_SHARE or line.errors:
            misses.append(f"{line.endpoint} c={line.concurrency}: {share:.0%}, {line.errors} errors")
    errors = sum(line.errors for line in lines if line.server == "reference")
    note = f" (the reference had {errors} errors)" if errors else ""
    if misses:
        return f"target (dygo >= {TARGET_SHARE:.0%} of the reference, 0 errors) missed: {'; '.join(misses)}{note}"
    return f"target met: dygo >= {TARGET_SHARE:.0%} of the reference at every line, 0 errors{note}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", help="PostgreSQL server (default: `dygo db url`, the embedded one)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--endpoints", nargs="+", choices=["one", "batch"], default=["one", "batch"])
    parser.add_argument("--batch", type=int, default=100, help="jobs per batch request (default: 100)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each hey run (default: 4)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server and line, interleaved (default: 2)")
    parser.add_argument("--pool-size", type=int, default=10, help="dygo's serve_pool_size (default: 10)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", type=Path, help="also write the lines to this file")
    args = parser.parse_args()
    if shutil.which("hey") is None:
        print("bench/http_bench.py needs `hey` (Debian: apt-get install hey)", file=sys.stderr)
        return 2
    url = fresh_database(args.server_url or embedded_server_url(), "bench_http")
    subprocess.run(
        [sys.executable, "-m", "dygo", "migrate"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)},
    )
    folder = Path(tempfile.mkdtemp(prefix="bench-http-"))
    bodies = {"one": folder / "one.json", "batch": folder / "batch.json"}
    bodies["one"].write_text(json.dumps({"kind": "example.noop", "args": {"n": 1}}))
    bodies["batch"].write_text(
        json.dumps({"jobs": [{"kind": "example.noop", "args": {"n": n}} for n in range(args.batch)]})
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    dygo, reference, paths = start_servers(url, args.pool_size)
    try:
        lines = measure(args, url, paths, bodies, {"dygo": dygo, "reference": reference})
    finally:
        dygo.stop()
        reference.stop()
    print(f"HTTP enqueue, {started}, {os.cpu_count()} CPUs, hey for {args.seconds:g}s x {args.rounds} rounds per line")
    print(table(lines, args.markdown))
    print(verdict(lines))
    if args.json:
        args.json.write_text(json.dumps([asdict(line) for line in lines], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
