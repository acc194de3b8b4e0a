# The two commands: `make run` and `make test`. Both set up everything from a bare Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8000
# Test processes side by side (pytest-xdist): most tests wait on workers and servers, not the CPU. Tests
# marked `alone` (they measure time) run after them, by themselves.
TEST_PROCESSES ?= 2

.PHONY: run test setup lint typecheck docs bench bench-http bench-dashboard bench-fleet bench-snapshot bench-table-size chaos chaos-pgbouncer stop-db browsers pgbouncer

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dygo needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip uninstall --quiet --yes dygo 2>/dev/null || true  # the name this project was installed by before dygo-jobs
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	@$(BIN)/dygo db start > /dev/null
	@$(BIN)/dygo migrate
	@echo
	@echo "  dygo is starting: dashboard http://127.0.0.1:$(PORT)/dashboard/  API docs http://127.0.0.1:$(PORT)/docs"
	@echo "  enqueue a job:  curl -s -X POST http://127.0.0.1:$(PORT)/api/v1/jobs -H 'content-type: application/json' \\"
	@echo "                    -d '{\"kind\": \"example.flaky\", \"args\": {\"failures\": 2}}'"
	@echo "  see it:         curl -s http://127.0.0.1:$(PORT)/api/v1/jobs/<id from the reply>"
	@echo "  from a shell:   $(BIN)/dygo status    $(BIN)/dygo jobs list"
	@echo "  Ctrl-C stops serve and worker; 'make stop-db' (or .venv/bin/dygo db stop) stops PostgreSQL."
	@echo
	DYGO_HOST=127.0.0.1 PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start --port $(PORT) web worker

stop-db: setup
	$(BIN)/dygo db stop

# The dashboard's browser tests drive Debian's Chromium (playwright cannot download browsers here).
# As root it is installed when missing; otherwise those tests skip and say why.
browsers:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	elif [ ! -x /usr/bin/chromium ]; then \
		echo "note: /usr/bin/chromium is missing and we are not root: the dashboard browser tests will skip"; \
	fi

# The PgBouncer tests (tests/test_pgbouncer.py) start Debian's pgbouncer (1.18) of their own.
# As root it is installed when missing; otherwise those tests skip and say why.
pgbouncer:
	@if [ ! -x /usr/sbin/pgbouncer ] && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; \
	elif [ ! -x /usr/sbin/pgbouncer ]; then \
		echo "note: /usr/sbin/pgbouncer is missing and we are not root: the PgBouncer tests will skip"; \
	fi

test: setup browsers pgbouncer
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadscope -m "not alone"
	$(BIN)/pytest -m alone

# The manual (docs/, mkdocs.yml) into site/; `make test` builds it too, where a broken link fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy, strict, over the installed package's layout (scripts/typecheck.py says why it copies the tree).
typecheck: setup
	$(BIN)/python scripts/typecheck.py

bench: setup
	$(BIN)/python bench/run.py

# POST /api/v1/jobs and /jobs/batch under 1-256 concurrent clients (hey), beside a bare FastAPI endpoint.
bench-http: setup
	@command -v hey > /dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hey; } || true
	$(BIN)/python bench/http_bench.py

# Seeds 1,000,000 jobs in bench_dashboard (embedded server) and times every dashboard page.
bench-dashboard: setup
	$(BIN)/python bench/dashboard_pages.py

# 1, 4, 16 and 64 worker processes drain 50,000 no-op jobs, then 5,000 jobs of 10 ms, from one private
# embedded server (.dygo/bench-fleet): jobs/s, peak connections, lock waits, duplicates (bench/README.md);
# after each, as many bare reference workers (bench/bare_worker.py) on the same jobs: the ceiling.
bench-fleet: setup
	$(BIN)/python bench/fleet.py --reference

# One worker at 200 jobs/s while another connection holds an xid for 10 minutes: pickup latency and
# sequential scans of dygo_jobs, clean against held (bench/README.md).
bench-snapshot: setup
	$(BIN)/python bench/held_snapshot.py

# Claim p50/p99 and enqueue/s with 10k, 1M and 10M rows in dygo_jobs (10M: minutes; bench/README.md).
bench-table-size: setup
	$(BIN)/python bench/table_size.py

# The fault-injection suite in full (10,000 jobs per scenario, several minutes); a short version of
# scenarios 1-6 runs inside `make test` (tests/test_chaos.py), and tests/test_presence.py and
# tests/test_failover.py prove the points of 7 and 8. See docs/operations/reliability.md.
chaos: setup
	$(BIN)/python -m chaos --markdown chaos/results.md --json chaos/results.json

# The same suite with every worker going through a PgBouncer (transaction mode) of the suite's own,
# LISTEN on the direct URL (tests/pgbouncer.py; the pgbouncer target installs it as root).
chaos-pgbouncer: setup pgbouncer
	$(BIN)/python -m chaos --pgbouncer --data-dir .dygo/chaos-pgbouncer --markdown chaos/results-pgbouncer.md \
		--json chaos/results-pgbouncer.json
