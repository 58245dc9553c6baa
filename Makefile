# One command each, on a fresh machine (Python 3.10+ with venv):
#   make demo    install only what the demo needs (the project + scikit-learn, ~0.5 GB), run the digits
#                exploration on an embedded LocalCluster
#   make test    set everything up, run the test suite
#   make test-fast  the tests not marked slow (a few minutes)
#   make test-newest  the fast tier again on the newest dask/distributed pyproject.toml admits (its own
#                     venv, .venv-newest): the other end of the supported range (CI runs both)
#   make docs    build the documentation site (Sphinx, warnings as errors) into docs/_build/html
#   make bench   set everything up, run the benchmarks (tables printed, JSON in benchmarks/results/)
#   make gpu-wheels   fetch the wheels benchmarks/gpu_check.sh carries to the GPU machine into .whl/
#                     (docs/gpu-check.md); needs only a Python with pip, not the venv
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test test-fast test-newest docs bench gpu-wheels clean

setup: $(VENV)/.installed

# torch is installed first and pinned: 2.13.0's CPU wheel is what this project is tested with,
# and installing it before the project keeps pip from resolving a (multi-GB) CUDA build.
# The ucx extra (distributed-ucxx-cu12, about 250 MB) runs on CPUs too: the tests use real UCX.
# The rest goes in with uv (pip installs it into the venv first): the same packages, bytecode
# compiled as pip compiles it, in 21 s instead of pip's 67 s (this 2-core machine, empty caches);
# where uv cannot install, pip does. $(call INSTALL,python,what) is that rule, written once.
INSTALL = $(1) -m pip install --quiet uv && $(1) -m uv pip install --quiet --compile-bytecode --python $(1) $(2) \
	|| $(1) -m pip install --quiet $(2)

SETUP_PACKAGES := -e ".[test,examples,bench,optuna,ucx,docs]"
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(call INSTALL,$(BIN)/python,$(SETUP_PACKAGES))
	touch $@

# The demo's own, lighter marker: the project and scikit-learn in the same .venv (no torch, Ray,
# Optuna, dask-ml or UCX: a 0.5 GB venv instead of 2.6 GB); make setup / test / bench add the rest
# to it later. Where the full setup is already there, this only confirms the demo extra.
$(VENV)/.demo-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[demo]"
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/python examples/digits_explore.py

# Two test processes (pytest-xdist), tests handed out as each finishes (worksteal): most tests
# wait on worker processes, clusters and subprocesses of their own, so two run side by side on
# 2 cores. PYTEST_WORKERS=0 runs them in this one process (e.g. for a debugger).
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal)

test: setup
	$(BIN)/python -m pytest $(XDIST)

test-fast: setup
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

# The newest end of pyproject.toml's dask/distributed range (the full suite runs on the oldest,
# 2026.7.1, which the ucx and gpu extras pin). No ucx extra here: distributed-ucxx pins the oldest.
NEWEST_DASK ?= 2026.8.0
NEWEST := .venv-newest
NEWEST_PACKAGES := ".[test,examples,optuna]" "dask==$(NEWEST_DASK)" "distributed==$(NEWEST_DASK)"
$(NEWEST)/.installed: pyproject.toml
	$(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet --upgrade pip
	$(NEWEST)/bin/python -m pip install --quiet torch==2.13.0
	$(call INSTALL,$(NEWEST)/bin/python,$(NEWEST_PACKAGES))
	touch $@

test-newest: $(NEWEST)/.installed
	cd $(NEWEST) && ./bin/python -c "import dask, distributed; print('dask', dask.__version__, 'distributed', distributed.__version__)"
	$(NEWEST)/bin/python -m pytest $(XDIST) -m "not slow" -p no:cacheprovider

docs: setup
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs/_build/html/index.html"

bench: setup
	$(BIN)/python benchmarks/explore_vs_naive.py
	$(BIN)/python benchmarks/sma_vs_ssgd.py
	$(BIN)/python benchmarks/allreduce.py
	$(BIN)/python benchmarks/memory_planner.py
	$(BIN)/python benchmarks/load.py
	$(BIN)/python benchmarks/sklearn_search.py
	$(BIN)/python benchmarks/train_explore.py   # Quiver vs Optuna vs Ray Tune on training runs; ~10 min
	$(BIN)/python benchmarks/collections_explore.py
	$(BIN)/python benchmarks/hosts.py   # needs root, ip and tc (says so and skips otherwise); ~20 min

gpu-wheels:
	PYTHON=$(PYTHON) bash benchmarks/gpu_wheels.sh

clean:
	rm -rf $(VENV) $(NEWEST) dask-worker-space dask-scratch-space docs/_build docs/generated docs/gallery
