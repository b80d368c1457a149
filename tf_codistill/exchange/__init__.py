"""The exchange between groups: the shared directory, its versions and formats, and publishing.

``config.Exchange`` says where and how a group exchanges models; ``directory`` is the layout of
the exchange directory and its atomic versions; ``lean_versions`` and ``weight_codecs`` the lean
formats; ``publishing`` the chief's publisher; ``topology`` which peers each group distills from.
"""
