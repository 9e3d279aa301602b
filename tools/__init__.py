"""The command-line drivers of logos-ir (installed as `logos_ir.tools`)."""
