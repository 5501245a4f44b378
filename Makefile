# gpupool: `make run` starts the embedded hub, `make test` runs ruff, mypy and pytest (a headless Chromium test
# among them, and Kubernetes tests on a control plane built from Go modules). Both set up .venv, the proxy
# and Debian's Chromium first; `make kube-up` starts that control plane with simulated GPU nodes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint typecheck pytest bench clean kube-build kube-up install uninstall

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	npm install --prefix .node --no-audit --no-fund configurable-http-proxy@4
	@# the browser test drives Debian's Chromium (Playwright's own browser download needs its CDN); the store
	@# tests run on Debian's PostgreSQL server too, and the Grafana dashboard's queries on Debian's Prometheus
	test -x /usr/bin/chromium && test -x /usr/bin/prometheus && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium postgresql prometheus; }
	touch $(STAMP)

# PORT=8001 when 8000 is taken
run: $(STAMP)
	$(BIN)/gpupool up $(if $(PORT),--port $(PORT))

test: lint typecheck pytest

# As root, for a lab's own server (README, "One server"): /opt/gpupool, /etc/gpupool, /var/lib/gpupool and the
# systemd unit gpupool.service. SIMULATED=1 serves the simulated pool, for a machine without GPUs.
install: $(STAMP)
	$(BIN)/gpupool install $(if $(SIMULATED),--simulated)

# PURGE=1 removes /etc/gpupool and /var/lib/gpupool too.
uninstall: $(STAMP)
	$(BIN)/gpupool uninstall $(if $(PURGE),--purge)

lint: $(STAMP)
	$(BIN)/ruff check spawner widgets tests benchmarks hub_config
	$(BIN)/ruff format --check spawner widgets tests benchmarks hub_config

typecheck: $(STAMP)
	$(BIN)/mypy spawner widgets

# A failed control-plane build does not stop the other tests: the Kubernetes tests then fail, saying why.
# Two workers (pytest-xdist): most tests wait on processes they started; a module, and every test on the
# control plane, stays on one worker, and the groups go out longest first (tests/conftest.py), not largest first.
pytest: $(STAMP)
	$(BIN)/python -m gpupool.spawner.kube.local.build || echo "gpupool: the Kubernetes tests will fail (above: why)"
	$(BIN)/pytest -q -n 2 --dist loadgroup --no-loadscope-reorder

# Everything but the tests that start processes, a browser or a cluster (pytest markers e2e, browser, kube).
test-fast: lint typecheck
	$(BIN)/pytest -q -m "not kube and not e2e and not browser"

# etcd, kube-apiserver, kube-scheduler and kube-controller-manager from their Go modules, built once into
# ~/.cache/gpupool/kube (GPUPOOL_KUBE_CACHE) and reused while the pinned versions match.
kube-build: $(STAMP)
	$(BIN)/python -m gpupool.spawner.kube.local.build

# A real control plane with the demo pool's nodes (POOL=file for another, STATE_DIR=folder to keep its data);
# prints KUBECONFIG=... when Ready.
kube-up: kube-build
	$(BIN)/gpupool kube up $(if $(POOL),--pool $(POOL)) $(if $(STATE_DIR),--state-dir $(STATE_DIR))

# The placement table of the README: make bench TRACE=path/to/cluster-trace-gpu-v2023 (see the README).
bench: $(STAMP)
	@test -n "$(TRACE)" || { echo "make bench needs TRACE=path/to/cluster-trace-gpu-v2023"; exit 2; }
	$(BIN)/python benchmarks/placement_table.py --trace $(TRACE) --out benchmarks/results

clean:
	rm -rf $(VENV) .node build *.egg-info
