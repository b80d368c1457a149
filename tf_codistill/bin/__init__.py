"""The console scripts: thin absl apps over the library.

Importing this package, before TensorFlow is imported, quiets TensorFlow's C++ start-up logging
(CPU feature notes, CUDA and TensorRT stubs) in every binary and the tasks a launch starts:
``--tf_log_level`` (TF_CPP_MIN_LOG_LEVEL: 0 shows everything, 1 hides info, the default 2 also
hides warnings, 3 also errors) or a ``TF_CPP_MIN_LOG_LEVEL`` already in the environment decides.
"""

import os
import sys

from absl import flags

DEFAULT_TF_LOG_LEVEL = "2"
TF_LOG_LEVELS = ("0", "1", "2", "3")

flags.DEFINE_enum("tf_log_level", DEFAULT_TF_LOG_LEVEL, TF_LOG_LEVELS,
                  "TensorFlow's C++ log level (TF_CPP_MIN_LOG_LEVEL): 0 shows everything, 1 hides "
                  "info, 2 also warnings, 3 also errors. Default: TF_CPP_MIN_LOG_LEVEL if set, "
                  "else 2.")


def _level_in(argv) -> str:
  """The --tf_log_level value on a command line (flags are parsed only after TF is imported)."""
  for i, arg in enumerate(argv):
    if arg.startswith("--tf_log_level="):
      return arg.split("=", 1)[1]
    if arg == "--tf_log_level" and i + 1 < len(argv):
      return argv[i + 1]
  return ""


if _level_in(sys.argv[1:]) in TF_LOG_LEVELS:
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = _level_in(sys.argv[1:])
else:  # absent (or invalid: absl then refuses it naming the flag)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_TF_LOG_LEVEL)
