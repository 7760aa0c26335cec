# durable-ui: `make demo` to try it, `make test` to test it. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo serve test test-sqlite test-postgres lint lint-imports bench bench-peers migrations clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,langgraph]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) manage.py migrate --verbosity 0
	$(PY) manage.py demo

# Production: collect the static files (compressed, hashed names) and serve the dashboard with gunicorn.
# Needs SECRET_KEY and ALLOWED_HOSTS; README "Deploying" has the rest. BIND=0.0.0.0:8000 to listen on
# every interface; WEB_CONCURRENCY sets gunicorn's worker processes (its own variable).
BIND ?= 127.0.0.1:8000
serve: install
	DURABLE_PRODUCTION=1 $(PY) manage.py collectstatic --noinput --verbosity 0
	DURABLE_PRODUCTION=1 $(VENV)/bin/gunicorn durable_ui.wsgi --bind $(BIND) --access-logfile - \
		--workers $${WEB_CONCURRENCY:-3} --timeout 60 --graceful-timeout 30

# The full suite on the embedded SQLite database and on PostgreSQL (DATABASE_URL, the local server,
# or a throwaway cluster tests/services.py starts), side by side: most of the suite waits on worker
# processes, browsers and timers rather than on a core, so two suites share two cores with room to
# spare. Each suite's output is printed whole when it ends (make's --output-sync); -k runs the other
# to its end when one fails. REDIS_URL works like DATABASE_URL. One suite alone: make test-sqlite.
test: install lint-imports
	$(PY) tests/services.py browser
	@echo "make test: the SQLite and PostgreSQL suites run side by side; each prints its output when it ends"
	$(MAKE) --no-print-directory -j2 -k --output-sync=target test-sqlite test-postgres

test-sqlite: install
	env -u DATABASE_URL DURABLE_TEST_DB=sqlite $(PY) -m pytest $(PYTEST_ARGS)

test-postgres: install
	eval "$$($(PY) tests/services.py postgres redis)" && DURABLE_TEST_DB=postgres $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

# The engine's floors and the runs -> journal arrow (contracts in pyproject.toml).
lint-imports: install
	$(VENV)/bin/lint-imports --no-cache

bench: install
	$(PY) bench/step_overhead.py

# durable-ui beside DBOS and LangGraph (not dependencies of the product: their own venv, pinned in
# bench/peers/requirements.txt) and the floor, in one run -> bench/RESULTS.md. BENCH_ARGS=--quick for a smoke run.
PEERS_VENV := bench/peers/.venv
PEERS_STAMP := $(PEERS_VENV)/.installed
$(PEERS_STAMP): pyproject.toml bench/peers/requirements.txt
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet -e . -r bench/peers/requirements.txt
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m bench.peers.run $(BENCH_ARGS)

# Nothing is released yet, so the initial migrations are regenerated rather than stacked.
migrations: install
	rm -f journal/migrations/0001_initial.py runs/migrations/0001_initial.py
	mv journal/migrations/0002_append_only_trigger.py /tmp/durable-0002.py
	$(PY) manage.py makemigrations journal runs; mv /tmp/durable-0002.py journal/migrations/0002_append_only_trigger.py

clean:
	rm -rf $(VENV) db.sqlite3* test-db.sqlite3* var test-output
