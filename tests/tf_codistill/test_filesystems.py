"""Remote schemes used by exchange and data paths are registered before any I/O."""

import subprocess
import sys

import pytest
from tensorflow.python.lib.io import file_io

from data_pipelines import parquet
from tf_codistill import filesystems


def test_local_and_gs_paths_need_only_core_tensorflow(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_io", None)  # importing it would raise
  filesystems.ensure_filesystems(["/tmp/local", None, "gs://bucket/exchange"])
  assert "gs" in file_io.get_registered_schemes()


@pytest.mark.skipif(not parquet.tensorflow_io_loads(),
                    reason="tensorflow-io (the io extra) is not installed or does not load here")
def test_s3_is_registered_through_tensorflow_io():
  filesystems.ensure_filesystems(["/tmp/local", None, "gs://bucket/exchange",
                                  "s3://bucket/exchange"])
  assert {"s3", "gs", "hdfs"} <= set(file_io.get_registered_schemes())


def test_unknown_scheme_is_an_error_naming_the_path():
  with pytest.raises(ValueError, match=r"ftp://host/x: no filesystem for scheme 'ftp'"):
    filesystems.ensure_filesystems(["ftp://host/x"])


def test_unknown_scheme_never_imports_tensorflow_io(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_io", None)  # importing it would raise
  with pytest.raises(ValueError, match=r"no filesystem for scheme 'ftp'.*with tensorflow-io"):
    filesystems.ensure_filesystems(["ftp://host/x"])


def test_a_scheme_of_tensorflow_io_without_it_names_the_extra():
  # A fresh process, as where tensorflow-io is not installed (this one may have loaded it).
  code = ("import sys; sys.modules['tensorflow_io'] = None\n"
          "from tf_codistill import filesystems\n"
          "filesystems.ensure_filesystems(['az://acct/c'])")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert done.returncode != 0
  assert ("ValueError: az://acct/c: az:// needs tensorflow-io (pip install 'tf-codistill[io]'), "
          "which loads on TensorFlow 2.17 only") in done.stderr, done.stderr[-2000:]
