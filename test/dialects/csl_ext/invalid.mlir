// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// One verifier diagnostic per case: each names the op and what is wrong.

// CHECK: csl_ext.set_color_config: 'UP' is not a direction (one of RAMP, NORTH, SOUTH, EAST, WEST)
%x = arith.constant 1 : i16
csl_ext.set_color_config %x, %x colour #builtin.int<2> rx ["UP"] tx ["RAMP"]

// -----

// CHECK: csl_ext.set_color_config: colour 3 needs at least one rx and one tx direction
%x = arith.constant 1 : i16
csl_ext.set_color_config %x, %x colour #builtin.int<3> rx [] tx ["RAMP"]

// -----

// CHECK: csl_ext.initialize_queue: a queue is an input or an output queue, not 'inout'
csl_ext.initialize_queue "inout" #builtin.int<2> colour #builtin.int<8>

// -----

// CHECK: csl_ext.initialize_queue: queue 8 is outside 0..7
csl_ext.initialize_queue "input" #builtin.int<8> colour #builtin.int<8>

// -----

// CHECK: csl_ext.initialize_queue: a queue is bound to a literal colour or to a colour parameter
csl_ext.initialize_queue "input" #builtin.int<2>

// -----

// CHECK: csl_ext.initialize_queue: colour 24 is outside 0..23
csl_ext.initialize_queue "output" #builtin.int<2> colour #builtin.int<24>
