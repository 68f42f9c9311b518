# Every target sets up .venv by itself (idempotent). torch is pinned in pyproject.toml, PyPI's CUDA build (several
# GB of CUDA libraries, which run on a CPU too): a fresh install's time and size are in docs/results.md.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
STAMP  := $(VENV)/.installed
# pyproject.toml's torch pin (its one home), read here for the install's first, lone step
TORCH  := $(shell sed -n 's/^ *"\(torch==[^"]*\)",*$$/\1/p' pyproject.toml)
OUT    ?= out/drill

.PHONY: install test test-unit test-dist test-workflow test-gpu drill render templates lint bench \
        image image-docker gke-up gke-destroy e2e-kind cluster-build cluster-build-kueue cluster-up cluster-down cluster-status e2e gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Pinned first and alone, so that nothing else decides its version.
	test -n "$(TORCH)" || { echo "error: no torch==VERSION in pyproject.toml's dependencies" >&2; exit 1; }
	$(PY) -m pip install -q '$(TORCH)'
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Two workers (pytest-xdist), each test module on one of them (its fixtures built once): the suite's
# processes mostly wait on each other, on sockets and on the disk, so two keep two cores busy.
test: install lint
	$(PYTEST) -q -n 2 --dist loadscope --durations=10 --ignore=tests/e2e tests

test-unit: install
	$(PYTEST) -q tests/unit

test-dist: install
	$(PYTEST) -q tests/dist

test-workflow: install
	$(PYTEST) -q tests/workflow

test-gpu: install
	$(PYTEST) -q tests/gpu

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

drill: install
	$(PY) workflows/equivalence.py run --out $(OUT) --force

render: install
	$(PY) workflows/equivalence.py render

templates: install
	$(PY) workflows/equivalence.py write-templates

clean:
	rm -rf .baton out .pytest_cache

# ---- cluster (see infra/README.md) ----
# baton's image without a daemon (buildah, on a Debian base made here), with Argo's executor and the pause
# sandbox: what the local cluster's containerd runs (infra/local/image.sh; cached by a content key).
image: cluster-build
	nice bash infra/local/image.sh

IMAGE ?= baton:dev
# The same Dockerfile with Docker, for a registry (make gke-up pushes the CUDA variant this way). MODEL=models/NAME
# bakes that model folder (inside the repository) into the image, with its manifest.
image-docker:
	$(if $(MODEL),MODEL_DIR=$(MODEL)) bash infra/scripts/build-image.sh $(IMAGE)

gke-up:
	bash infra/scripts/gke-up.sh

gke-destroy:
	bash infra/scripts/gke-destroy.sh

e2e-kind:
	bash infra/scripts/e2e-kind.sh

# ---- the real control plane on this machine (see infra/local/README.md): built from Go modules, cached ----
cluster-build:
	bash infra/local/packages.sh
	bash infra/local/build.sh

# Kueue's controller manager and JobSet's (infra/local/kueue.env), a cache entry of their own (its cold build
# time: docs/results.md); `python -m infra.local.cluster up --kueue` and
# tests/e2e/test_kueue_real.py use it, and skip or say so when it is not built.
cluster-build-kueue:
	nice bash infra/local/build-kueue.sh

# Builds first on a cold cache (with progress; its time is in docs/results.md); a warm one costs nothing.
cluster-up: install image
	$(PY) -m infra.local.cluster up

cluster-down: install
	$(PY) -m infra.local.cluster down

cluster-status: install
	$(PY) -m infra.local.cluster status

# The real-cluster suite (tests/e2e): on the real kube-apiserver and Argo controller, built by cluster-build
# (25 min cold, docs/results.md); root, for the pods' mount and PID namespaces. Not part of `make test`.
# In a PID namespace of its own: a signal sent to pid -1 by anything it starts reaches only its own processes
# (argoexec's emissary once did: docs/cluster-local.md).
e2e: install image $(VENV)/.e2e
	unshare --pid --fork --mount-proc $(PYTEST) -q tests/e2e

# The browser test's Playwright (pip) and Chromium (Debian's package, where apt-get may run it): without them the
# test is skipped, saying which is missing.
$(VENV)/.e2e: pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[e2e]'
	command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  apt-get install -y -q --no-install-recommends chromium >/dev/null; } || echo "note: no chromium; the UI test is skipped"
	touch $@

# ---- benchmarks (not tests: nothing asserts on time; writes docs/results.md) ----
bench: install
	$(PY) -m bench.run

# ---- GPU (see gpu/README.md): pre-flight suite + 0.5B-shaped drill; exits 2 without a CUDA device ----
GPU_CHECK_ARGS ?=
gpu-check: install
	$(PY) -m gpu.check $(GPU_CHECK_ARGS)
