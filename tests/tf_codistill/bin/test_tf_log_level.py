"""The binaries hide TensorFlow's C++ start-up logging unless --tf_log_level asks for it."""

import os
import re
import subprocess
import sys

from testing_utils import REPO

# TF <= 2.19: "2026-11-25 07:41:25.003047: I tensorflow/core/platform/cpu_feature_guard.cc:210]";
# TF >= 2.20 (absl): "I0000 00:00:1796288663.384408   11218 port.cc:153] ..." (info or warning).
TF_CPP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] "
                         r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "
                         r"|WARNING: All log messages before absl::InitializeLog)", re.M)


def _train_stderr(*flags):
  """stderr of tf-codistill-train stopped by a configuration error, once TF is imported."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  done = subprocess.run([sys.executable, "-m", "tf_codistill.bin.train",
                         "--model_dir=/nonexistent/x",
                         "--gin_bindings=trainer.train.no_such_parameter = 1", *flags],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr[-2000:]
  assert "no_such_parameter" in done.stderr
  return done.stderr


def test_tf_start_up_logging_is_hidden_by_default_and_shown_on_request():
  assert not TF_CPP_LINE.search(_train_stderr()), _train_stderr()
  assert TF_CPP_LINE.search(_train_stderr("--tf_log_level=0"))


def test_an_invalid_tf_log_level_is_refused_naming_the_flag():
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  done = subprocess.run([sys.executable, "-m", "tf_codistill.bin.train", "--model_dir=/tmp/x",
                         "--tf_log_level=9"], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode != 0 and "tf_log_level" in done.stderr, done.stderr[-2000:]


def test_absl_lines_below_the_level_are_dropped_with_their_continuation_lines():
  from tf_codistill import bin as binaries  # pylint: disable=g-import-not-at-top
  text = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
          "I0000 00:00:1796288667.156876   11224 cpu_feature_guard.cc:227] This is optimized\n"
          "To enable the following instructions: AVX2, rebuild TensorFlow.\n"
          "E0000 00:00:1796288668.149678   11224 cuda_platform.cc:52] failed call to cuInit\n"
          "a Python warning\n")
  assert binaries.shown_lines(text, 2) == ("E0000 00:00:1796288668.149678   11224 "
                                           "cuda_platform.cc:52] failed call to cuInit\n"
                                           "a Python warning\n")
  assert binaries.shown_lines(text, 3) == ""  # the Python line follows a hidden error: its tail
  assert binaries.shown_lines(text, 0) == text
  assert binaries.shown_lines("plain output\n", 3) == "plain output\n"


def test_a_task_asked_for_its_stacks_while_importing_tensorflow_dumps_them_and_lives():
  # The launcher's stall watchdog sends SIGUSR1; a task restarted seconds before may still be
  # importing TensorFlow, which must not make the signal kill it. The asking thread stays alive:
  # faulthandler walks every thread without the GIL, and a thread ending during the walk can
  # crash it (CI saw a thread state of id 0, then SIGSEGV); the launcher signals from outside.
  code = ("import os, signal, sys, threading, time\n"
          "def ask():\n"
          "  while 'tensorflow' not in sys.modules:\n"
          "    time.sleep(0.001)\n"
          "  signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)\n"
          "  threading.Event().wait()\n"
          "threading.Thread(target=ask, daemon=True).start()\n"
          "import tf_codistill.bin\n"
          "print('alive')\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr[-2000:]
  assert "Current thread" in done.stderr or "Thread 0x" in done.stderr, done.stderr[-2000:]
