# The two commands that matter: `make report` and `make test`. Each sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch for pip, as it is (it may name an index); a GPU host overrides it (e.g. TORCH_SPEC=torch).
TORCH_SPEC ?= torch==2.13.0
SMOKE ?= 0
SKIP_ESPEAK ?= 0

.PHONY: all setup espeak report test lab clean gpu-bundle gpu-commit summary

all: test

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[notebooks,test,adapters]"
	$(PY) -m ipykernel install --sys-prefix --name workbench --display-name "workbench (.venv)" >/dev/null
	touch $@

# espeak-ng is not part of the .venv stamp: each set-up checks for it again. The script installs it where
# it can (root + apt-get), says how where it cannot (and lets the set-up go on), and fails when apt-get
# fails; SKIP_ESPEAK=1 goes on without it.
espeak:
	@command -v espeak-ng >/dev/null || [ "$(SKIP_ESPEAK)" = "1" ] || sh scripts/install_espeak.sh

setup: $(VENV)/.installed espeak

report: setup
	$(PY) -m workbench report --out reports $(if $(filter 1,$(SMOKE)),--smoke,)

test: setup
	$(VENV)/bin/ruff check workbench benchmarks tests
	$(PY) -m pytest -q -n 2 --dist worksteal -p no:nbval tests
	WORKBENCH_SMOKE=1 $(PY) -m pytest -q -n 2 --dist loadfile --nbval-lax --nbval-kernel-name workbench -p no:cacheprovider notebooks

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --no-browser --allow-root --ip=127.0.0.1

gpu-bundle:
	sh scripts/gpu_bundle.sh

# Before each GPU call (carry .gpu_commit): the device copy's .git may be stale, so results take this.
gpu-commit: setup
	WORKBENCH_GIT_COMMIT= $(PY) -c "from workbench.records.results import git_commit; print(git_commit())" > .gpu_commit

# After adding or replacing a file in benchmarks/results: regenerate the headline page (a test checks it).
summary: setup
	$(PY) -m workbench.records.summary --out benchmarks/SUMMARY.md

clean:
	rm -rf reports .pytest_cache
