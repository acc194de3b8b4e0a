"""Type-check dygo with mypy, strict, as the installed package `dygo` sees it.

The repository maps its folders onto one package (`store/` is `dygo.store`, see pyproject.toml's
package-dir), which an editable install resolves at import time but mypy cannot follow. So the
sources are copied into the package's shape under `.dygo/typecheck/`, checked there, and every
path mypy prints is mapped back to the repository's own. Usage: `python scripts/typecheck.py`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / ".dygo" / "typecheck"
FOLDERS = {"store": "store", "worker": "worker", "app": "app"}  # repository folder -> subpackage of dygo


def copy_sources(tree: Path = TREE) -> Path:
    """Lay the sources out as the installed package `dygo` under `tree` (its py.typed marker too); returns
    the package's folder."""
    package = tree / "dygo"
    shutil.rmtree(package, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "dygo", package, ignore=ignore)
    for folder, subpackage in FOLDERS.items():
        shutil.copytree(REPO / folder, package / subpackage, ignore=ignore)
    return package


def repository_path(line: str) -> str:
    """`dygo/store/x.py:3: error` -> `store/x.py:3: error`; `dygo/cli.py` stays as it is."""
    return re.sub(r"^dygo/(store|worker|app)/", r"\1/", line)


def main() -> int:
    copy_sources()
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(REPO / "pyproject.toml"),
        "--cache-dir",
        str(TREE / "cache"),
        "-p",
        "dygo",
    ]
    checked = subprocess.run(command, cwd=TREE, capture_output=True, text=True)
    for line in (checked.stdout + checked.stderr).splitlines():
        print(repository_path(line))
    return checked.returncode


if __name__ == "__main__":
    sys.exit(main())
