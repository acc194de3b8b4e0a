"""The ways of counting workflow jobs that bench/cycle_cost.py, bench/trigger_cost.py, bench/workflows.py and
bench/run.py compare, installed on a benchmark's own database after migrating (migration 0017's is what dygo
runs; the others are measured only).

* `current`: migration 0017 as it is: one statement trigger on update (`dygo_jobs_updated`: wake-ups, result
  waiters and workflow counts, reading the NEW rows once) and one on delete, both with transition tables,
  run by every update and delete, plain jobs' included.
* `none`: no workflow counting: migration 0016's two update triggers (wake-ups; result waiters, `skipped`
  included) and no delete trigger: what a plain job cost before workflows. No workflow can move.
* `separate`: `none` plus the counting as a third update trigger of its own (`dygo_jobs_moved`) and 0017's
  delete trigger: 0017's first draft. A plain statement calls three functions instead of one.
* `row`: `none` plus row triggers, whose WHEN clause leaves out every row that is not a workflow job entering
  or leaving an ended state. The executor tests the clause itself, without calling a function or keeping a
  transition table; each workflow row that moves calls dygo_tally for its node (a count, and dygo_advance) on
  its own, where 0017 calls it once per statement.
* `no_children`: `current` with migration 0017's functions (dygo_jobs_updated without its fourth part, the
  counting of child jobs; dygo_jobs_removed without its count of deleted children): what a plain job cost
  before `ctx.call` and `ctx.map`. Every other variant has 0018's functions, as migrated.
* `deferred`: the same WHEN-filtered row triggers, each only writing its job's counts to an unlogged inbox
  (dygo_node_moves, no lock taken); the transaction's first such row arms one deferred constraint trigger,
  which at commit takes the transaction's rows out of the inbox and calls dygo_tally once, nodes in id order.
  Workflow jobs cost a row insert and delete; nodes are counted at the commit, not at each statement's end.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

MIGRATIONS = Path(__file__).resolve().parent.parent / "store" / "migrations"
MIGRATION = MIGRATIONS / "0017_workflows.sql"
CHILDREN_MIGRATION = MIGRATIONS / "0018_steps.sql"
VARIANTS = ("current", "none", "separate", "row", "deferred", "no_children")
# Every trigger on dygo_jobs that some variant puts on update or delete (dygo_jobs_updated is 0017's or 0016's).
TRIGGERS = (
    "dygo_jobs_updated",
    "dygo_jobs_finished",
    "dygo_jobs_moved",
    "dygo_jobs_removed",
    "dygo_job_moved",
    "dygo_job_removed",
)

ENDED = "('succeeded', 'dead', 'cancelled', 'skipped')"

ROW_TRIGGERS = f"""
CREATE OR REPLACE FUNCTION dygo_job_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    was_ended boolean := OLD.state IN {ENDED};
    state text := CASE WHEN was_ended THEN OLD.state ELSE NEW.state END;
    delta integer := CASE WHEN was_ended THEN -1 ELSE 1 END;
BEGIN
    PERFORM dygo_tally(ARRAY[NEW.node_id],
        ARRAY[CASE WHEN state = 'succeeded' THEN delta ELSE 0 END],
        ARRAY[CASE WHEN state = 'dead' THEN delta ELSE 0 END],
        ARRAY[CASE WHEN state = 'cancelled' THEN delta ELSE 0 END],
        ARRAY[CASE WHEN state = 'skipped' THEN delta ELSE 0 END],
        ARRAY[CASE WHEN NOT was_ended AND NEW.state = 'succeeded' THEN NEW.result END]);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION dygo_job_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dygo_tally(ARRAY[OLD.node_id], ARRAY[0], ARRAY[0], ARRAY[1], ARRAY[0], ARRAY[NULL::jsonb]);
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_job_moved AFTER UPDATE OF state ON dygo_jobs FOR EACH ROW
    WHEN (NEW.node_id IS NOT NULL AND (OLD.state IN {ENDED}) <> (NEW.state IN {ENDED})
          AND current_setting('dygo.advancing', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION dygo_job_moved();
CREATE TRIGGER dygo_job_removed AFTER DELETE ON dygo_jobs FOR EACH ROW
    WHEN (OLD.node_id IS NOT NULL AND OLD.state NOT IN {ENDED})
    EXECUTE FUNCTION dygo_job_removed();
"""


DEFERRED_TRIGGERS = f"""
CREATE UNLOGGED TABLE IF NOT EXISTS dygo_node_moves (
    node_id bigint NOT NULL, ds integer NOT NULL, df integer NOT NULL, dc integer NOT NULL, dk integer NOT NULL,
    result jsonb
);

CREATE OR REPLACE FUNCTION dygo_job_moved_later() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    was_ended boolean := OLD.state IN {ENDED};
    state text := CASE WHEN was_ended THEN OLD.state ELSE NEW.state END;
    delta integer := CASE WHEN was_ended THEN -1 ELSE 1 END;
BEGIN
    INSERT INTO dygo_node_moves VALUES (NEW.node_id,
        CASE WHEN state = 'succeeded' THEN delta ELSE 0 END, CASE WHEN state = 'dead' THEN delta ELSE 0 END,
        CASE WHEN state = 'cancelled' THEN delta ELSE 0 END, CASE WHEN state = 'skipped' THEN delta ELSE 0 END,
        CASE WHEN NOT was_ended AND NEW.state = 'succeeded' THEN NEW.result END);
    PERFORM set_config('dygo.moves', 'on', true);  -- after the insert, whose event this armed
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION dygo_job_removed_later() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dygo_node_moves VALUES (OLD.node_id, 0, 0, 1, 0, NULL);
    PERFORM set_config('dygo.moves', 'on', true);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION dygo_tally_moves() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    moved_nodes bigint[]; n_succeeded integer[]; n_dead integer[]; n_cancelled integer[]; n_skipped integer[];
    n_results jsonb[];
BEGIN
    PERFORM set_config('dygo.moves', '', true);
    -- Every row another transaction wrote is either not committed (unseen) or was taken out before its commit.
    WITH taken AS (
        DELETE FROM dygo_node_moves RETURNING *
    ), d AS (
        SELECT node_id, sum(ds)::integer AS ds, sum(df)::integer AS df, sum(dc)::integer AS dc,
               sum(dk)::integer AS dk, (array_agg(result) FILTER (WHERE ds > 0))[1] AS result
        FROM taken GROUP BY node_id
    )
    SELECT array_agg(node_id ORDER BY node_id), array_agg(ds ORDER BY node_id), array_agg(df ORDER BY node_id),
           array_agg(dc ORDER BY node_id), array_agg(dk ORDER BY node_id), array_agg(result ORDER BY node_id)
    INTO moved_nodes, n_succeeded, n_dead, n_cancelled, n_skipped, n_results FROM d;
    IF moved_nodes IS NOT NULL THEN
        PERFORM dygo_tally(moved_nodes, n_succeeded, n_dead, n_cancelled, n_skipped, n_results);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_job_moved AFTER UPDATE OF state ON dygo_jobs FOR EACH ROW
    WHEN (NEW.node_id IS NOT NULL AND (OLD.state IN {ENDED}) <> (NEW.state IN {ENDED})
          AND current_setting('dygo.advancing', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION dygo_job_moved_later();
CREATE TRIGGER dygo_job_removed AFTER DELETE ON dygo_jobs FOR EACH ROW
    WHEN (OLD.node_id IS NOT NULL AND OLD.state NOT IN {ENDED})
    EXECUTE FUNCTION dygo_job_removed_later();
CREATE CONSTRAINT TRIGGER dygo_node_moves_tally AFTER INSERT ON dygo_node_moves
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (current_setting('dygo.moves', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION dygo_tally_moves();
"""


def _baseline_triggers() -> str:
    """Migration 0016's update triggers, as 0017's down migration puts them back: wake-ups, and result waiters
    (here with 0017's `skipped` among the final states)."""
    down = (MIGRATIONS / "0017_workflows.down.sql").read_text()
    found = re.search(r"CREATE FUNCTION dygo_notify_finished\(\).*?\n\$\$;", down, re.DOTALL)
    if found is None:
        raise SystemExit("0017_workflows.down.sql: no dygo_notify_finished function in it")
    function = found.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    function = function.replace("('succeeded', 'dead', 'cancelled')", ENDED)
    triggers = migration_triggers(MIGRATIONS / "0017_workflows.down.sql", ("dygo_jobs_updated", "dygo_jobs_finished"))
    return "\n".join([function, *triggers])


def _separate_trigger() -> str:
    """The counting part of 0017's dygo_jobs_updated as a trigger function of its own, beside the baseline's."""
    found = re.search(r"    EXECUTE \$query\$.*?\n    END IF;\n", MIGRATION.read_text(), re.DOTALL)
    if found is None:
        raise SystemExit(f"{MIGRATION}: no counting query in dygo_jobs_updated")
    return f"""
CREATE OR REPLACE FUNCTION dygo_jobs_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    moved_nodes bigint[]; n_succeeded integer[]; n_dead integer[]; n_cancelled integer[]; n_skipped integer[];
    n_results jsonb[];
BEGIN
    IF NOT EXISTS (SELECT FROM new_rows WHERE node_id IS NOT NULL)
       OR current_setting('dygo.advancing', true) = 'on' THEN
        RETURN NULL;
    END IF;
{found.group(0)}    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_moved AFTER UPDATE ON dygo_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dygo_jobs_moved();
"""


def migration_triggers(migration: Path, names: tuple[str, ...]) -> list[str]:
    """A migration's CREATE TRIGGER statements for the triggers `names`, read from the migration itself."""
    text = migration.read_text()
    found = [re.search(rf"CREATE TRIGGER {name} .*?;", text, re.DOTALL) for name in names]
    if not all(found):
        raise SystemExit(f"{migration}: no CREATE TRIGGER for one of {', '.join(names)}")
    return [match.group(0) for match in found if match]


def trigger_functions(migration: Path) -> str:
    """A migration's dygo_jobs_updated and dygo_jobs_removed functions, as CREATE OR REPLACE statements."""
    text = migration.read_text()
    found = [
        re.search(rf"CREATE (OR REPLACE )?FUNCTION {name}\(\).*?\n\$\$;", text, re.DOTALL)
        for name in ("dygo_jobs_updated", "dygo_jobs_removed")
    ]
    if not all(found):
        raise SystemExit(f"{migration}: no dygo_jobs_updated or dygo_jobs_removed function in it")
    return "\n".join(
        re.sub(r"^CREATE (OR REPLACE )?FUNCTION", "CREATE OR REPLACE FUNCTION", m.group(0)) for m in found if m
    )


def install(conn: psycopg.Connection, variant: str) -> None:
    """Put `variant` in place on a migrated database, whichever was there before."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    with conn.transaction():
        for trigger in TRIGGERS:
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger} ON dygo_jobs")
        conn.execute("DROP TABLE IF EXISTS dygo_node_moves")  # with its trigger
        conn.execute(
            trigger_functions(
                MIGRATIONS / ("0017_workflows.sql" if variant == "no_children" else CHILDREN_MIGRATION.name)
            )
        )
        if variant in ("current", "no_children"):
            for statement in migration_triggers(MIGRATION, ("dygo_jobs_updated", "dygo_jobs_removed")):
                conn.execute(statement)
            return
        conn.execute(_baseline_triggers())
        if variant == "separate":
            conn.execute(_separate_trigger())
            conn.execute(migration_triggers(MIGRATION, ("dygo_jobs_removed",))[0])
        elif variant == "row":
            conn.execute(ROW_TRIGGERS)
        elif variant == "deferred":
            conn.execute(DEFERRED_TRIGGERS)
