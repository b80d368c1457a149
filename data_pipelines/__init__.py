"""tf.data input pipelines per data format, and generators of real-format data."""
