"""The passes and emitters of logos-ir (installed as `logos_ir.passes`): one pass or emitter a module."""
