"""Property-based pass over the OpenAPI document (schemathesis): no generated request gets a 5xx.

Bounded to a few examples per operation so it stays a matter of seconds; it runs against a real
`dygo serve` and PostgreSQL with an admin token (so every operation is reached, nuke included:
the database is this module's own).
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from dygo.store import enqueue
from hypothesis import HealthCheck, given, settings

from tests.conftest import ADMIN_TOKEN, REPO, TEST_CONFIG
from tests.schemathesis_hooks import shorter_wait

# DYGO_FUZZ_EXAMPLES=500 for a deeper run; DYGO_FUZZ_SEED picks the CLI run's seed (15 by default).
EXAMPLES_PER_OPERATION = int(os.environ.get("DYGO_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def api_schema(module_api, module_db_url):
    import psycopg

    with psycopg.connect(module_db_url, autocommit=True) as conn:  # a few rows, so ids and cursors find something
        for n in range(5):
            enqueue(conn, "test.record", {"seconds": n}, delay="1h" if n % 2 else None)
    return schemathesis.openapi.from_url(f"{module_api.url}/openapi.json")


def operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_no_generated_request_gets_a_server_error(api_schema, module_api):
    # Driven by hypothesis directly: schemathesis' pytest loader does not work with this pytest.
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    checked = []
    for operation in operations(api_schema):

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def no_server_error(case) -> None:
            case.query = shorter_wait(case.query)
            response = case.call(base_url=module_api.url, headers=headers, timeout=70)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
            )
            if response.status_code >= 400:
                error = response.json()["error"]
                assert error["code"] and error["message"] and "Traceback" not in response.text

        no_server_error()
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert "POST /api/v1/jobs" in checked and "GET /api/v1/jobs" in checked and len(checked) >= 20


# The creates of app/workflows.py take well-formed bodies the document cannot tell from good ones: `after`
# naming a node of the same body, no cycle, a name used once, a kind registered or given a queue, for every
# node. A well-formed body that breaks one of those rules is refused with 422 (invalid_workflow, naming the
# node, or the job's own error), so for these operations 422 is an answer to well-formed data too.
WORKFLOW_CREATES = """
[[operations]]
include-method = "POST"
include-path-regex = "^/api/v1/(workflows|batches|batches/[^/]+/jobs)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429"]
"""


@pytest.mark.timeout(600)  # a few dozen examples of each of some 47 operations, in every phase
def test_schemathesis_with_every_check_finds_nothing(serve, db_url, tmp_path):
    """The CLI, every check (status codes, content types, headers, response schemas, negative data
    refused and positive data accepted, auth enforced, 405 with the right Allow, ...) in every phase:
    the document says what the server does. `ignored_auth` sends wrong tokens on purpose, so this
    service's failed-token limits are raised (config in a copy of tests/config). PostgreSQL text holds no
    NUL and UTF-8 no lone surrogate: generated strings leave both out (the server refuses them, 422, as the
    document's description says; free-form args cannot carry that rule in JSON Schema). A generated `?wait=`
    waits at most a second (tests/schemathesis_hooks.py)."""
    import shutil
    import subprocess
    import sys

    import psycopg

    config = tmp_path / "config"
    shutil.copytree(TEST_CONFIG, config)
    with (config / "dygo.yml").open("a") as settings:
        settings.write("failed_token_limit: 100000\nfailed_token_global_limit: 100000\n")
    api = serve(DYGO_CONFIG_DIR=str(config))
    with psycopg.connect(db_url, autocommit=True) as conn:  # a few rows, so ids and cursors find something
        for n in range(5):
            enqueue(conn, "test.record", {"seconds": n}, delay="1h" if n % 2 else None)
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{api.url}/openapi.json",
        "--checks",
        "all",
        "-H",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--request-timeout",
        "70",
        "--seed",
        os.environ.get("DYGO_FUZZ_SEED", "15"),
        "--workers",
        "1",
        "--no-color",
        "--generation-allow-x00",
        "false",
        "--generation-codec",
        "utf-8",
    ]
    (tmp_path / "schemathesis.toml").write_text(WORKFLOW_CREATES)  # found in the working directory
    hooks = {"SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=tmp_path, env={**os.environ, **hooks}
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-20000:]
