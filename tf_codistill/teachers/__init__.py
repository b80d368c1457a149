"""Teachers: stale copies of the peers, found, restored (at their precision) and swapped in.

``pool`` polls the exchange and loads new versions off the training thread; ``restoring`` reads
a peer's weights by key; ``quantization`` makes int8 teacher copies.
"""
