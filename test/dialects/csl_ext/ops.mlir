// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// Every op of csl_ext (the CSL builtins xDSL 0.74's csl dialect lacks), printed in its custom form and parsed back.

%x = arith.constant 1 : i16
%y = arith.constant 2 : i16
csl_ext.set_color_config %x, %y colour #builtin.int<2> rx ["EAST"] tx ["WEST", "RAMP"]
csl_ext.block #builtin.int<12>
csl_ext.unblock #builtin.int<12>
csl_ext.comment "LOGOS program: decode step's head"

// CHECK:      csl_ext.set_color_config %{{.*}}, %{{.*}} colour #builtin.int<2> rx ["EAST"] tx ["WEST", "RAMP"]
// CHECK-NEXT: csl_ext.block #builtin.int<12>
// CHECK-NEXT: csl_ext.unblock #builtin.int<12>
// CHECK-NEXT: csl_ext.comment "LOGOS program: decode step's head"
