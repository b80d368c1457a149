"""One group's training: the model and its train step, the trainer's loop, and the hooks.

``model.CodistillModel`` computes the codistillation loss; ``codistill_hooks`` publishes and
refreshes teachers inside ``fit``; ``trainer`` builds data, model and callbacks and runs ``fit``;
``strategies``, ``tasks``, ``checkpointing``, ``monitoring`` and ``step_timing`` are its parts.
"""
