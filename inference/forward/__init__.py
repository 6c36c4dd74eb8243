"""The engine's in-place forward passes, one module per model family (as keras-hub has one
folder per family).

Each pass computes what the family's ``call_with_cache`` computes, with the model's own layers,
for ``tokens [rows, T]`` at per-row positions, but keeps each layer's keys and values as separate
arrays that are updated in place (``inference.engine`` explains why). Traced inside jit only.
"""
