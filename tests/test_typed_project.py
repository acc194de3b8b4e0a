"""A project using only dygo's public API, checked by `mypy --strict` against dygo as installed (py.typed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = REPO / "tests" / "typed_project"
WORK = REPO / ".dygo" / "typed-project"  # kept between runs: mypy's cache makes a warm check take a second

sys.path.insert(0, str(REPO / "scripts"))
from typecheck import copy_sources  # noqa: E402


@pytest.fixture(scope="module")
def mypy_report() -> tuple[int, str]:
    """mypy --strict over right.py and wrong.py, with dygo found as an installed package (`site/` on the
    path, as site-packages would hold it), so its py.typed marker is what lets mypy read its types."""
    copy_sources(WORK / "site")
    project = WORK / "project"
    shutil.rmtree(project, ignore_errors=True)
    (project / "tests" / "typed_project").mkdir(parents=True)
    for package in ("tests", "tests/typed_project"):
        (project / package / "__init__.py").touch()
    for source in PROJECT.glob("*.py"):
        shutil.copy2(source, project / "tests" / "typed_project" / source.name)
    command = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(WORK / "cache")]
    files = ["tests/typed_project/right.py", "tests/typed_project/wrong.py"]
    env = {**os.environ, "PYTHONPATH": str(WORK / "site")}
    checked = subprocess.run(command + files, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return checked.returncode, checked.stdout + checked.stderr


def marked_lines(name: str) -> set[int]:
    lines = (PROJECT / name).read_text().splitlines()
    return {number for number, line in enumerate(lines, 1) if "# wrong:" in line}


def test_mypy_strict_reports_each_wrong_field_option_and_args_type(mypy_report):
    code, output = mypy_report
    reported = {int(n) for n in re.findall(r"^tests/typed_project/wrong\.py:(\d+): error", output, re.M)}
    assert code == 1
    assert reported == marked_lines("wrong.py"), output
    assert 'Unexpected keyword argument "subjet" for "SendEmail"' in output


def test_mypy_strict_passes_the_right_typed_enqueue(mypy_report):
    _, output = mypy_report
    assert [line for line in output.splitlines() if "wrong.py" not in line] == []


def test_the_enqueueing_guide_shows_what_mypy_says(mypy_report):
    _, output = mypy_report
    guide = (REPO / "docs" / "guides" / "enqueueing.md").read_text()
    shown = [line for line in guide.splitlines() if line.startswith("wrong.py:")]
    assert len(shown) == len(marked_lines("wrong.py"))
    assert all(f"tests/typed_project/{line}" in output for line in shown), output
