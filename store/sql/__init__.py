"""Every SQL statement dygo runs, one module per area, each statement a constant named for what it does.

Nothing outside `store` writes SQL. Each module's docstring names the store module(s) that run its
statements. A store module imports the area it runs as `sql` (`from dygo.store.sql import enqueue as
sql`), another area by its name, or one statement by its own name.

Each statement is written whole. A fragment stays a named constant only where several statements must
share it exactly: the job row (JOB_COLUMNS, sql/job_reads.py) and what a retry sets (REVIVED,
sql/admin_jobs.py), imported where they are used; within one module, an enqueue's values, the frame of a
bulk action and a schedule's columns.

Two kinds of statement live with the code that owns them instead: the claim's statements, with the row
type they fill, in store/claim.py, and the per-transaction settings strings of store/claim.py and
store/leases.py.
"""
