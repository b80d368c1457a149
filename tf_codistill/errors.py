"""Errors that stop a task for good, and the exit statuses that tell the launcher not to retry.

A task that exits with one of ``PERMANENT_EXIT_CODES`` failed for a reason a restart cannot fix
(its configuration, its input data, a diverged loss); the launcher reports it and does not
restart the group. Any other non-zero status (a killed process, a lost peer task) is a process
fault that a restart from the last checkpoint can fix. No TensorFlow import here: the launcher
uses this module.
"""

from __future__ import annotations

from typing import Dict

CONFIGURATION_EXIT_CODE = 2
DATA_EXIT_CODE = 3
NON_FINITE_EXIT_CODE = 4
PERMANENT_EXIT_CODES: Dict[int, str] = {
    CONFIGURATION_EXIT_CODE: "configuration error",
    DATA_EXIT_CODE: "bad input data",
    NON_FINITE_EXIT_CODE: "non-finite loss",
}


class ConfigurationError(ValueError):
  """A configuration that cannot work (flag, gin binding, TF_CONFIG, directory); raised before
  any training starts."""


class NonFiniteLossError(RuntimeError):
  """Training produced a NaN/Inf loss; ``step`` is the optimizer step where it was seen."""

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step
