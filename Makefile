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

# The full suite on the embedded SQLite database, then on PostgreSQL (DATABASE_URL, the local
# server, or a throwaway cluster tests/services.py starts). REDIS_URL works the same way.
test: install lint-imports
	$(PY) tests/services.py browser
	$(MAKE) --no-print-directory test-sqlite
	$(MAKE) --no-print-directory test-postgres

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
