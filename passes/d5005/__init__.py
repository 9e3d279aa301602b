"""The d5005 lane's lowering levels, in pipeline order, and its emitters (see docs/d5005.md)."""
