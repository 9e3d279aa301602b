"""The xDSL dialects of logos-ir (installed as `logos_ir.dialects`): one dialect a module."""
