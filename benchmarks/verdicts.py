"""What a benchmark's summary calls a goal met: one rule for the suites and the measuring
modules (``goal_verdicts`` in every summary.json)."""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

OPS = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
       ">": lambda a, b: a > b}  # the comparisons of goal thresholds


def judge(goals: Mapping[str, Optional[float]], thresholds: Mapping[str, Sequence]
             ) -> Dict[str, dict]:
  """Per goal with a threshold ``(op, value)`` or ``(op, value, bound)``: met when the value
  passes and, with a bound, its whole ``<goal>_interval`` lies beyond the bound (below it for
  ``<``/``<=``, above for ``>``/``>=``). A goal whose value (or needed interval) is missing, a
  target never reached, churn not measured, is missed, never left blank."""
  out = {}
  for name, (op, threshold, *bound) in thresholds.items():
    value, interval = goals.get(name), goals.get(f"{name}_interval")
    met = value is not None and OPS[op](value, threshold)
    if bound:
      below = op.startswith("<")
      end = (interval or [None, None])[1 if below else 0]
      met = met and end is not None and (end < bound[0] if below else end > bound[0])
    out[name] = {"threshold": [op, threshold, *bound], "met": bool(met),
                 "missing": value is None or (bool(bound) and not interval)}
  return out
