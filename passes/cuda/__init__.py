"""The cuda lane's lowering levels, in pipeline order, and its emitters (see docs/cuda.md)."""
