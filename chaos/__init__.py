"""The fault-injection suite: real `dygo worker` processes, real PostgreSQL, faults injected, books checked.

`python -m chaos` (or `make chaos`) runs every scenario in full; tests/test_chaos.py runs a short
version of each. See chaos/runner.py for the scenarios and the books check.
"""
