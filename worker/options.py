"""What `dygo worker` was asked to do (its flags, resolved against config), and who it is."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkerOptions:
    queues: dict[str, int]  # queue name -> concurrency in this process
    poll_interval: float = 60.0
    poll_only: bool = False
    once: bool = False
    shutdown_timeout: float = 30.0
    metrics_port: int | None = None  # serve this process's own metrics (worker/telemetry.py); None: off
    metrics_host: str = "127.0.0.1"
    cron: bool = True  # fire due schedules (--no-cron, `cron: false`: this worker leaves them to others)
    ready_file: Path | None = None  # created once ready, removed at stop (--ready-file)
    max_concurrency: int | None = None  # handlers of all queues together (--max-concurrency, max_concurrency)


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
