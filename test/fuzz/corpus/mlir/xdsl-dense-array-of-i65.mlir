builtin.module attributes {a = array<i65: 1>} {
}
