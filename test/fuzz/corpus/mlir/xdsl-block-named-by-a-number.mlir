builtin.module {
^31:
}
