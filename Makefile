# fleetserve — `make demo` runs the main job, `make test` the tests; both set up everything they need.
VENV      ?= .venv
PY        := $(VENV)/bin/python
PIP       := $(PY) -m pip --disable-pip-version-check -q
STAMP     := $(VENV)/.installed
# Debian packages the tests and benchmarks drive as real third-party peers (chromium: the dashboard's
# browser test); buildah and debootstrap build the container image in the slow image test (a Debian root
# file system stands in for the Docker Hub base, which cannot be pulled here). kubectl is no package here:
# Debian 12's kubernetes-client (1.20) bundles a kustomize too old for the manifests; the machine image
# ships kubectl 1.32, and the kustomize tests skip with that reason where it is missing. iproute2 and
# iptables serve the fault harness's network partitions (network namespaces, veth, packet drop and delay).
APT_PKGS  := nginx haproxy prometheus wrk chromium buildah debootstrap iproute2 iptables
PYTEST_ARGS ?=

.PHONY: help setup system-deps test test-all demo bench lint clean
help:
	@echo "make demo      build + measure the engine, start a local fleet, drive 20 s of load through it, report"
	@echo "make test      fast test suite (unit + integration with real processes)"
	@echo "make test-all  everything, including slow scenario tests"
	@echo "make bench     engine benchmark -> table for BENCHMARKS.md"
	@echo "make lint      ruff + mypy"

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	# torch only for exporting the zoo models; 2.13.0 is the CPU wheel on this machine's disk.
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[export,test,fast,plot,gpu,trace]'
	touch $@

system-deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The gateway's tests run a second time with the in-process gateways on aiohttp (--server aiohttp).
test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)
	FLEETSERVE_TEST_GATEWAY_SERVER=aiohttp $(PY) -m pytest -q tests/gateway $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -q -m "" $(PYTEST_ARGS)
	FLEETSERVE_TEST_GATEWAY_SERVER=aiohttp $(PY) -m pytest -q -m "" tests/gateway $(PYTEST_ARGS)

demo: setup
	$(PY) benchmarks/engine.py --quick
	$(PY) -m fleetserve.fleet.demo --model minilm --precision int8 --replicas 2 --rate 100 --duration 20

bench: setup
	$(PY) benchmarks/engine.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy fleetserve

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
