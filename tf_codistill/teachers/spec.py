"""How a CodistillModel builds its teacher copies: a clone of the student at a precision, or a
factory of another form (``tfc.TeacherSpec``, owned by the model, not by the exchange)."""

import dataclasses
from typing import Callable, Optional

import gin
import tf_keras as keras

from tf_codistill.errors import ConfigurationError

# precision -> the tf_keras dtype policy of the teacher copies (int8: of their layers that are
# not quantized, see quantization.py).
PRECISIONS = {"float32": "float32", "bfloat16": "bfloat16", "mixed_bfloat16": "mixed_bfloat16",
              "int8": "float32"}


@gin.configurable(module="tfc")
@dataclasses.dataclass(frozen=True)
class TeacherSpec:
  """How the teacher copies are built.

  Attributes:
    precision: of a clone of the student: ``float32``; ``bfloat16`` (teacher variables and
      compute in bfloat16: half the memory, read by key from peers' float32 versions and cast:
      restoring.py); ``mixed_bfloat16`` (float32 variables, bfloat16 compute); ``int8``
      (Embedding and Dense weights as int8 codes with per-row scales, under a third of the
      memory: quantization.py).
    factory: builds a teacher copy in another form instead of a clone (a model holding the
      student's weights otherwise, ``quantization.ConvertedLayer``; copies for publishing stay
      clones of the student). Its own layers set its precision.
    student_factory: the same, built from the student (``student_factory(student)``, e.g.
      ``@models.ctr_teacher``): the form gin can bind, since a gin file cannot name the student.

  Raises:
    ConfigurationError: an unknown precision, a precision with a factory, or both factories.
  """
  precision: str = "float32"
  factory: Optional[Callable[[], keras.Model]] = None
  student_factory: Optional[Callable[[keras.Model], keras.Model]] = None

  def __post_init__(self):
    factories = [f"tfc.TeacherSpec.{name}" for name in ("factory", "student_factory")
                 if getattr(self, name) is not None]
    if len(factories) == 2:
      raise ConfigurationError(f"{factories[0]} and {factories[1]} are both set: set one")
    if self.precision not in PRECISIONS:
      raise ConfigurationError(f"tfc.TeacherSpec.precision={self.precision!r} is not one of "
                               f"{list(PRECISIONS)}")
    if factories and self.precision != "float32":
      raise ConfigurationError(
          f"tfc.TeacherSpec.precision={self.precision!r} applies to cloned teachers, and "
          f"{factories[0]} is set: build the factory's layers in that dtype policy instead (e.g. "
          "models.ctr_teacher.dtype_policy) and leave the precision float32")

  def maker(self, student: keras.Model) -> Optional[Callable[[], keras.Model]]:
    """What builds one teacher copy of ``student`` in the spec's other form (None: a clone). A
    student factory that cannot build a teacher of this student raises ConfigurationError
    naming it (a permanent failure, not one a restart fixes)."""
    if self.student_factory is None:
      return self.factory
    student_factory = self.student_factory

    def make() -> keras.Model:
      try:
        return student_factory(student)
      except ValueError as e:
        raise ConfigurationError(f"tfc.TeacherSpec.student_factory: {e}") from None
    return make

  @property
  def factory_name(self) -> Optional[str]:
    """The factory's name, for results (None: teachers are clones)."""
    factory = self.factory or self.student_factory
    return None if factory is None else getattr(factory, "__name__", repr(factory))

  def dtype_policy(self) -> Optional[str]:
    """The dtype policy of cloned teachers (None: the student's own)."""
    policy = PRECISIONS[self.precision]
    return None if policy == "float32" else policy
