"""Optimizer fusion (``fusion``, ``fused_models``) and the gradient communication options of
synchronous groups (``comm``)."""
