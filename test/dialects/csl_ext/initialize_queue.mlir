// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// csl_ext.initialize_queue in both forms (a literal colour, a colour parameter of the tile code: a csl.param, so
// inside a csl.module), printed in its custom form and parsed back.

"csl.module"() <{kind = #csl<module_kind program>}> ({
  %west = "csl.param"() <{param_name = "row_west_in"}> : () -> !csl.color
  csl_ext.initialize_queue "input" #builtin.int<4> colour #builtin.int<8>
  csl_ext.initialize_queue "output" #builtin.int<2> param %west : !csl.color
}) {sym_name = "program"} : () -> ()

// CHECK:      %[[WEST:.*]] = "csl.param"() <{param_name = "row_west_in"}> : () -> !csl.color
// CHECK-NEXT: csl_ext.initialize_queue "input" #builtin.int<4> colour #builtin.int<8>
// CHECK-NEXT: csl_ext.initialize_queue "output" #builtin.int<2> param %[[WEST]] : !csl.color
