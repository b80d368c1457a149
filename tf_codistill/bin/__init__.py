"""The console scripts: thin absl apps over the library.

Importing this package, before TensorFlow is imported, quiets TensorFlow's C++ start-up logging
(CPU feature notes, CUDA and TensorRT stubs) in every binary and the tasks a launch starts:
``--tf_log_level`` (TF_CPP_MIN_LOG_LEVEL: 0 shows everything, 1 hides info, the default 2 also
hides warnings, 3 also errors) or a ``TF_CPP_MIN_LOG_LEVEL`` already in the environment decides.
TensorFlow is imported here, once: from TF 2.20 its libraries log through absl before absl's
logging is initialized, and such lines go to stderr whatever the level (abseil-cpp #1718), so
the import's stderr is read back and its lines below the level are dropped.
"""

import faulthandler
import os
import re
import signal
import sys
import tempfile

from absl import flags

# SIGUSR1 dumps every thread's stack (the launcher's stall watchdog asks a task for them), from
# here on: a task still importing TensorFlow would otherwise be killed by the signal, unseen.
# Into a copy of stderr made now: while TensorFlow is imported, stderr is read back for its
# start-up lines, and a dump held there would be lost with a task stopped meanwhile.
_STACKS = os.fdopen(os.dup(2), "w")
faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)

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

# An absl C++ log line ("I0000 00:00:1796288663.384408   11218 port.cc:153] ..."): severity, text.
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
_BEFORE_INIT = ("WARNING: All log messages before absl::InitializeLog() is called are written "
                "to STDERR")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


def shown_lines(text: str, level: int) -> str:
  """``text`` less its absl C++ log lines (with their continuation lines) below ``level``."""
  kept, hiding = [], False
  for line in text.splitlines(keepends=True):
    found = _ABSL_LINE.match(line)
    if found:
      hiding = _SEVERITY[found.group(1)] < level
    elif line.rstrip("\n") == _BEFORE_INIT:  # absl's own warning, a line of its own
      if level <= _SEVERITY["W"]:
        kept.append(line)
      continue
    if not hiding:
      kept.append(line)
  return "".join(kept)


def _import_tensorflow(level: int) -> None:
  """Imports TensorFlow with its start-up lines below ``level`` left out of stderr."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      sys.stderr.write(shown_lines(captured.read().decode(errors="replace"), level))
      sys.stderr.flush()


if "tensorflow" not in sys.modules:
  _level = os.environ["TF_CPP_MIN_LOG_LEVEL"]
  _import_tensorflow(int(_level) if _level in TF_LOG_LEVELS else 0)
