"""The spatial lane's lowering levels, in pipeline order, and its emitters (see docs/spatial.md)."""
