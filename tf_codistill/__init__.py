"""tf-codistill: codistillation (online distillation) for TensorFlow distributed training."""

__version__ = "0.1.0"
