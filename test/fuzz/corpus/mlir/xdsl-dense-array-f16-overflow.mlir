builtin.module attributes {a = array<f16: 1.0e300>} {
}
