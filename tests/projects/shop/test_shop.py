"""The tests of the shop's jobs, with dygo's pytest plugin (`-p dygo.testing` in pyproject.toml)."""

import asyncio

from dygo import enqueue


# --8<-- [start:test]
def test_placing_an_order_sends_its_receipt(dygo_conn, enqueued, drain):
    enqueue(dygo_conn, "orders.place", {"order_id": 7})
    assert [job.kind for job in enqueued()] == ["orders.place"]

    runs = drain()  # every due job, in this process, until none is left

    assert runs.outcomes() == [
        ("orders.place", "succeeded"),
        ("emails.receipt", "retried"),  # its backoff skipped
        ("emails.receipt", "succeeded"),
    ]
    (receipt,) = enqueued("emails.receipt")
    assert receipt.state == "succeeded" and receipt.result == {"sent": 7}
    assert enqueued(args={"order_id": 7}, state="succeeded")  # args: those fields among the job's


# --8<-- [end:test]


def test_a_schedule_runs_on_demand(enqueued, drain):
    runs = drain(schedules=["nightly-report"])
    assert runs.outcomes() == [("reports.nightly", "succeeded")]
    assert runs[0].result == "report written"


def test_nothing_due_drains_nothing(enqueued, drain):
    assert drain() == [] and enqueued() == []


def test_an_async_test_awaits_adrain(dygo_conn, adrain):
    enqueue(dygo_conn, "reports.nightly", {})
    runs = asyncio.run(adrain())
    assert [run.outcome for run in runs] == ["succeeded"]


def test_each_test_has_a_database_of_its_own(enqueued):
    assert enqueued() == []
