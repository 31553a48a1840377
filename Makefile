# Two commands set up and run the product on a fresh clone: `make demo` and `make test`.
# Both create and fill .venv when it is missing (or when pyproject.toml changed).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# macOS takes plain mlx (Metal); Linux takes the CPU build unless FLEET_EXTRA says otherwise (cuda).
ifeq ($(shell uname -s),Darwin)
EXTRAS ?= dev
else
EXTRAS ?= $(or $(FLEET_EXTRA),cpu),dev
endif

# Debian's OpenBLAS, when present, replaces the reference BLAS of mlx[cpu] (trainer/blas.py).
OPENBLAS := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
                                   /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3))
BLAS_ENV := $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS) FLEET_BLAS=openblas,)

.PHONY: demo test lint fmt clean venv

venv: $(VENV)/.installed

# A fresh clone spends a minute or two here (mlx, pyarrow, textual...): say so, then how long.
$(VENV)/.installed: pyproject.toml
	@echo "make: setting up $(VENV) with mlx-fleet[$(EXTRAS)] and its dependencies (once;" \
	      "about 1-2 minutes on a fresh clone, less when only pyproject.toml changed)..."
	@start=$$(date +%s); \
	test -x $(BIN)/python || { echo "make: creating $(VENV) with $(PYTHON)"; \
	                           $(PYTHON) -m venv $(VENV); } && \
	echo "make: upgrading pip" && $(BIN)/python -m pip install -q --upgrade pip && \
	echo "make: installing mlx-fleet[$(EXTRAS)] (the longest step)" && \
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]" && \
	touch $@ && echo "make: $(VENV) is ready ($$(( $$(date +%s) - start )) s)"

demo: venv
	$(BIN)/fleet demo

test: venv
	$(BLAS_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
