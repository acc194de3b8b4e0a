"""The worker registry: each worker's heartbeat row, and what the admin and GET /metrics read of them.

Run by store/leases.py (heartbeat, stale rows, a worker's exit), store/admin.py (LIVE_WORKERS) and
store/metrics.py (METRICS_BUSY_SLOTS).
"""

WORKER_HEARTBEAT = """
INSERT INTO dygo_workers (id, hostname, pid, queues) VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s)
ON CONFLICT (id) DO UPDATE SET last_seen_at = now(), queues = excluded.queues"""
WORKER_GONE = "DELETE FROM dygo_workers WHERE id = %s"
FORGET_STALE_WORKERS = "DELETE FROM dygo_workers WHERE last_seen_at < now() - make_interval(secs => %s)"
LIVE_WORKERS = """
SELECT id, hostname, pid, queues, started_at, last_seen_at FROM dygo_workers
WHERE last_seen_at >= now() - make_interval(secs => %s) ORDER BY started_at"""

# Jobs running now per lease owner (worker id) and queue: active rows only, found through the
# dygo_jobs_leases partial index, so as many rows as there are busy slots in the cluster.
METRICS_BUSY_SLOTS = """
SELECT lease_owner, queue, count(*) FROM dygo_jobs WHERE state = 'active' AND lease_owner IS NOT NULL
GROUP BY lease_owner, queue"""
