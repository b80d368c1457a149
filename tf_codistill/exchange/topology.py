"""Teacher graphs of n-way codistillation: which peer groups each group distills from.

* ``all_to_all``: every other group; the distillation target is the average of all peers.
* ``ring``: group i learns from its predecessor ``(i - 1) mod n`` only (for n = 2 both graphs are
  the same).
"""

from __future__ import annotations

from typing import List

GRAPHS = ("all_to_all", "ring")
MAX_GROUPS = 8


def teacher_groups(group: int, num_groups: int, graph: str = "all_to_all") -> List[int]:
  """The peer groups that group ``group`` of ``num_groups`` distills from, in ascending order."""
  if graph not in GRAPHS:
    raise ValueError(f"teacher_graph={graph!r} is not one of {GRAPHS}")
  if num_groups < 2:
    raise ValueError(f"codistillation needs num_groups >= 2, got {num_groups}")
  if not 0 <= group < num_groups:
    raise ValueError(f"group={group} is out of range for num_groups={num_groups}")
  if graph == "ring":
    return [(group - 1) % num_groups]
  return [g for g in range(num_groups) if g != group]
