builtin.module attributes {a = 1 : i99999999999999999999} {
}
