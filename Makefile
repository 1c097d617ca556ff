# Quick start: `make run` (execute the course) and `make test` (unit tests + every notebook).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PROFILE ?= ci
STAMP  := $(VENV)/.installed

.PHONY: setup run test unit test-browser lab notebooks clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh scripts/install_peers.sh
	bash scripts/install.sh $(PYTHON) $(VENV)
	@touch $(STAMP)

run: setup  ## execute every solution notebook (PROFILE=ci|full), write build/executed and build/html
	$(VENV)/bin/pdlab course run --profile $(PROFILE)

test: setup  ## unit tests + papermill execution of every solution and student notebook
	$(VENV)/bin/pytest -q

unit: setup  ## the tests that start no engine, run no notebook and open no browser (a few minutes)
	$(VENV)/bin/pytest -q -m "not live and not notebook and not browser and not student_lab and not slow"

test-browser: setup  ## JupyterLab in headless Chromium: run notebook 02 and drive its explorer
	$(VENV)/bin/pytest -q -s -m browser

lab: setup  ## open JupyterLab on the course with the project's kernel
	$(VENV)/bin/pdlab course kernel
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --ServerApp.root_dir=. --MappingKernelManager.transport_encryption=required $(if $(filter 0,$(shell id -u)),--allow-root)

notebooks: setup  ## regenerate notebooks/ and labs/ (student copies) from solutions/
	$(VENV)/bin/pdlab course build

clean:
	rm -rf build .pytest_cache
