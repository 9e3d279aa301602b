builtin.module attributes {a = 1 : i1099511627776} {
}
