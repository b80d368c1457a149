"""TeacherSpec: precisions, factories, and the errors that name them."""

import gin
import pytest

from tf_codistill.errors import ConfigurationError
from tf_codistill.launch import gin_config
from tf_codistill.teachers import spec


def test_a_student_factory_builds_from_the_student_and_names_itself_when_it_cannot():
  # A permanent failure (exit status of a configuration error), not one a restart would retry.
  from tf_codistill.models import ctr
  from tf_codistill.models import mlp
  student = mlp.mlp(num_classes=3)
  assert spec.TeacherSpec().maker(student) is None  # clones
  zero_arg = spec.TeacherSpec(factory=lambda: mlp.mlp(num_classes=3))
  assert zero_arg.maker(student) is zero_arg.factory
  make = spec.TeacherSpec(student_factory=ctr.ctr_teacher).maker(student)
  with pytest.raises(ConfigurationError,
                     match="tfc.TeacherSpec.student_factory: .* is not a models.ctr_model"):
    make()
  ctr_student = ctr.ctr_model()
  teacher = spec.TeacherSpec(student_factory=ctr.ctr_teacher).maker(ctr_student)()
  assert teacher is not ctr_student
  assert spec.TeacherSpec(student_factory=ctr.ctr_teacher).factory_name == "ctr_teacher"


@pytest.mark.parametrize("kwargs,message", [
    (dict(precision="int4"), r"tfc.TeacherSpec.precision='int4' is not one of"),
    (dict(precision="bfloat16", student_factory=lambda s: s),
     r"applies to cloned teachers, and tfc.TeacherSpec.student_factory is set"),
    (dict(precision="bfloat16", factory=lambda: None),
     r"applies to cloned teachers, and tfc.TeacherSpec.factory is set"),
    (dict(factory=lambda: None, student_factory=lambda s: s), "both set: set one"),
])
def test_bad_specs_are_refused_naming_the_setting(kwargs, message):
  with pytest.raises(ConfigurationError, match=message):
    spec.TeacherSpec(**kwargs)


def test_the_old_teacher_fn_binding_names_the_student_factory():
  gin.clear_config()
  try:
    with pytest.raises(ConfigurationError, match=r"tfc.TeacherSpec.student_factory"):
      gin_config.parse_gin([], ["trainer.train.teacher_fn = @models.ctr_teacher"])
  finally:
    gin.clear_config()
