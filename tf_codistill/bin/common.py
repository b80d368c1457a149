"""Flags, gin parsing and error exits shared by the binaries."""

import sys
from typing import NoReturn, Sequence

from absl import flags

import tf_codistill as tfc
from tf_codistill import errors


def define_gin_flags() -> None:
  flags.DEFINE_multi_string("gin_file", [], "Gin config file(s); repeatable.")
  flags.DEFINE_multi_string("gin_bindings", [],
                            "Gin bindings, e.g. 'trainer.train.train_steps = 100'.")


def first_line(error: BaseException) -> str:
  """The error's message without what gin appends ("In call to configurable ...")."""
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


PROGRAM = ["tf-codistill"]  # set by each binary to its console-script name


def exit_with_error(message: str, code: int = errors.CONFIGURATION_EXIT_CODE) -> NoReturn:
  """Prints one line, ``<program>: error: <message>``, to stderr and exits with ``code``."""
  print(f"{PROGRAM[0]}: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def parse_flags_or_exit(argv: Sequence[str]) -> Sequence[str]:
  """absl's flag parsing, with an unknown or malformed flag as a one-line error."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    exit_with_error(f"{first_line(e)} (--helpfull lists the flags)")


def parse_gin_or_exit(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> None:
  """Parses gin; a bad file, binding or value type is a one-line error before any work starts."""
  try:
    tfc.parse_gin(gin_files, gin_bindings)
  except tfc.ConfigurationError as e:
    exit_with_error(first_line(e))
