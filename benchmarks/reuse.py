"""When a recorded run still counts: the configuration that determines an arm's runs, compared
under today's gin names, and the folders of tuning runs.

A suite reuses a recorded run only while its arm's configuration (``arm_config``) is the recorded
one. Renames of gin settings and settings Arm gained later are mapped here, so that neither
invalidates hours of recorded runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from benchmarks import suite_spec as spec
from tf_codistill.training import train_config

# The Arm settings every configuration holds when recorded. A setting Arm gains later is
# recorded only where an arm sets it (off its default), so adding one leaves every recorded arm,
# and every tuning run's folder, as it was.
RECORDED_ARM_FIELDS = ("name", "gin_files", "gin_bindings", "num_groups", "seeds", "strategy",
                       "workers_per_group", "ps_per_group", "kind", "source_arm", "ensemble_size",
                       "tune_learning_rate", "seed_offset", "learning_rate_from")
# Settings the first recorded configurations predate: their absence there means their default.
_ADDED_AFTER_FIRST_RECORDS = ("tune_learning_rate", "seed_offset", "learning_rate_from")


def arm_default(name: str) -> Any:
  """The default of Arm setting ``name``, as a configuration records it (tuples as lists)."""
  field = next(f for f in dataclasses.fields(spec.Arm) if f.name == name)
  value = field.default
  return list(value) if isinstance(value, tuple) else value


# Gin settings renamed after runs were recorded under their old names: new name -> old name.
# A recorded configuration is read under today's names, so a rename keeps every recorded run;
# tuning runs keep their folders, named under the old names. The exchange, teacher, data,
# group-shape, checkpoint and distillation settings moved from trainer.train into tfc.Exchange,
# tfc.TeacherSpec, tfc.Data, tfc.Group, tfc.Checkpoints and tfc.Distillation after the first runs.
RECORDED_BINDING_NAMES: Dict[str, str] = {
    **{f"tfc.Exchange.{name}": f"trainer.train.{name}"
       for name in ("publish_every_steps", "keep_last", "poll_interval_s", "publish_format",
                    "wait_for_first_teachers_s", "teacher_graph", "averaging")},
    "tfc.TeacherSpec.precision": "trainer.train.teacher_precision",
    # The data, group, checkpoint and distillation settings: the library's own table of what
    # moved.
    **{new: f"trainer.train.{old}" for old, (new, _) in train_config.RENAMED.items()
       if new.startswith(("tfc.Data.", "tfc.Group.", "tfc.Checkpoints.", "tfc.Distillation."))},
}
# Whole bindings whose value changed with their name: new binding -> recorded binding.
RECORDED_BINDINGS: Dict[str, str] = {
    "trainer.train.exchange = @tfc.Exchange": "trainer.train.codistill = True",
    "trainer.train.exchange = None": "trainer.train.codistill = False",
}


# What an averaging binding recorded without codistillation (it averaged only) is today.
_AVERAGING_ONLY = ["trainer.train.exchange = @tfc.Exchange", "tfc.Exchange.distill = False"]


def _renamed(binding: str, names: Mapping[str, str], whole: Mapping[str, str]) -> str:
  if binding.strip() in whole:
    return whole[binding.strip()]
  name, sep, value = binding.partition("=")
  new = names.get(name.strip())
  return f"{new} ={value}" if sep and new else binding


def as_recorded(bindings: Sequence[str]) -> List[str]:
  """``bindings`` ("name = value") as the first recorded configurations wrote them."""
  stripped = [b.strip() for b in bindings]
  if all(b in stripped for b in _AVERAGING_ONLY):
    bindings = [b for b in bindings if b.strip() not in _AVERAGING_ONLY]
  return [_renamed(b, RECORDED_BINDING_NAMES, RECORDED_BINDINGS) for b in bindings]


def as_current(bindings: Sequence[str]) -> List[str]:
  """Recorded ``bindings`` under today's names (unchanged if they already are)."""
  names = {old: new for new, old in RECORDED_BINDING_NAMES.items()}
  whole = {old: new for new, old in RECORDED_BINDINGS.items()}
  current: List[str] = []
  for binding in bindings:
    if (binding.partition("=")[0].strip() == "trainer.train.averaging"
        and "trainer.train.codistill = True" not in [b.strip() for b in bindings]):
      current += _AVERAGING_ONLY
    current.append(_renamed(binding, names, whole))
  return current


def bindings_as(config: dict, convert: Callable[[Sequence[str]], List[str]]) -> dict:
  """``config`` (an arm_config) with each of its lists of bindings ``convert``ed."""
  return {**config, "arm": {**config["arm"], "gin_bindings": convert(
      config["arm"]["gin_bindings"])}, "common_bindings": convert(config["common_bindings"]),
          "data": convert(config["data"])}


def arm_config(arm: spec.Arm, suite: spec.Suite, data: Sequence[str]) -> dict:
  """Everything that determines an arm's runs: reuse is only safe while this is unchanged."""
  fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(arm).items()
            if k not in ("label", "scope", "churn_pairs")
            and (k in RECORDED_ARM_FIELDS or v != arm_default(k))}
  return {"arm": fields, "common_bindings": list(suite.common_bindings), "data": list(data),
          "threads_per_group": suite.threads_per_group}


def same_config(recorded: Optional[dict], config: dict) -> bool:
  """Whether runs recorded under ``recorded`` were made as ``config`` makes them: equal under
  today's binding names, but for Arm settings added after the record, which it holds at their
  defaults."""
  if recorded is None:
    return False

  def known(c: dict) -> dict:
    c = bindings_as(c, as_current)
    arm = {k: v for k, v in c["arm"].items()
           if not (k in _ADDED_AFTER_FIRST_RECORDS and v == arm_default(k))}
    return {**c, "arm": arm}
  return known(recorded) == known(config)


def tuning_name(config: Mapping[str, Any], readable_chars: int = 60) -> str:
  """The folder of the tuning runs of an arm configuration (``arm_config``, under the binding
  names first recorded): the arm's own settings, readable (``batch_size_128``; groups and
  strategy where not the default; at most ``readable_chars``), then a digest of the whole
  configuration, which alone tells configurations apart (files and data included); the digest
  alone for an arm with no settings of its own."""
  digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
  arm = config["arm"]
  settings = [(name.strip().rsplit(".", 1)[-1], value)
              for name, _, value in (b.partition("=") for b in arm.get("gin_bindings", ()))]
  settings += [(k, arm[k]) for k in ("num_groups", "strategy")
               if arm.get(k, arm_default(k)) != arm_default(k)]
  readable = "+".join(re.sub(r"[^A-Za-z0-9.-]+", "_", f"{name}_{value}").strip("_")
                      for name, value in settings)[:readable_chars].rstrip("+_")
  return f"{readable}-{digest}" if readable else digest
