"""logos-ir: an MLIR-style compiler, on xDSL, for transformer language models written once as LOGOS programs.

The core lives here (spec, author, program API, frontend, weights, interpreter, errors); the dialects, passes and
command-line tools live in the repository's `dialects/`, `passes/` and `tools/` folders and install as
`logos_ir.dialects`, `logos_ir.passes` and `logos_ir.tools`.
"""

__version__ = "0.1.0"
