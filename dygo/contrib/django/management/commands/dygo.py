"""`manage.py dygo worker|serve|migrate ...`: the dygo command line with the project's settings."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dygo.contrib.django import run


class Command(BaseCommand):  # type: ignore[misc]  # Django has no type hints
    help = (
        "Run a dygo command (worker, serve, migrate, status, ...) with this project's database (DATABASES) "
        "and jobs (each installed app's jobs.py): manage.py dygo worker --concurrency 4"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dygo_args", nargs=argparse.REMAINDER, help="a dygo command and its flags")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every flag after `dygo` is dygo's (`manage.py dygo worker --help` shows the worker's), none Django's.
        sys.exit(run(argv[2:]))

    def handle(self, *args: Any, **options: Any) -> None:
        code = run([*args, *options["dygo_args"]])
        if code:
            raise CommandError(f"dygo exited with status {code}")
