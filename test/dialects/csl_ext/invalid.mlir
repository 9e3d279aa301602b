// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// One verifier diagnostic per case: each names the op and what is wrong.

// CHECK: csl_ext.set_color_config: 'UP' is not a direction (one of RAMP, NORTH, SOUTH, EAST, WEST)
%x = arith.constant 1 : i16
csl_ext.set_color_config %x, %x colour #builtin.int<2> rx ["UP"] tx ["RAMP"]

// -----

// CHECK: csl_ext.set_color_config: colour 3 needs at least one rx and one tx direction
%x = arith.constant 1 : i16
csl_ext.set_color_config %x, %x colour #builtin.int<3> rx [] tx ["RAMP"]
