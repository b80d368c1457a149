"""The names of the strategies a group can train under, without importing TensorFlow (the
launcher checks ``--strategy`` before any task starts)."""

KINDS = ("one_device", "mirrored", "multi_worker_mirrored", "parameter_server")
