"""Model architectures (tf_keras), each built by a gin-configurable function returning logits."""
