"""Remote schemes used by exchange and data paths are registered before any I/O."""

import pytest
from tensorflow.python.lib.io import file_io

from tf_codistill import filesystems


def test_s3_is_registered_through_tensorflow_io():
  filesystems.ensure_filesystems(["/tmp/local", None, "gs://bucket/exchange",
                                  "s3://bucket/exchange"])
  assert {"s3", "gs", "hdfs"} <= set(file_io.get_registered_schemes())


def test_unknown_scheme_is_an_error_naming_the_path():
  with pytest.raises(ValueError, match=r"ftp://host/x: no filesystem for scheme 'ftp'"):
    filesystems.ensure_filesystems(["ftp://host/x"])
