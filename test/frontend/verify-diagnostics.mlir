// RUN: logos-opt %s --split-input-file --verify-diagnostics
// RUN: sed -e 's/unknown input kind/unknown output kind/' %s > %t.mlir
// RUN: not logos-opt %t.mlir --split-input-file --verify-diagnostics 2>&1 | FileCheck %s --check-prefix=WRONG
// RUN: sed -e 's/expected-error@+1/expected-error@+2/' %s > %t.line.mlir
// RUN: not logos-opt %t.line.mlir --split-input-file --verify-diagnostics 2>&1 | FileCheck %s --check-prefix=LINE

// --verify-diagnostics as mlir-opt's: every diagnostic is expected by a comment on its line (or @+N, @-N, @above,
// @below), and a wrong expectation fails the run. The RUN lines are written as LLVM developers write them.

// expected-error@+1 {{'logos.input' op has unknown input kind 'tokenz'}}
%t = logos.input "tokenz" values [1] : tensor<1xi64>

// -----

%t = logos.input "token" values [1, 2] : tensor<1xi64> // expected-error {{number of values mismatch: got 2, expected 1}}

// -----

%t = logos.input "token" values [0] : tensor<1xi64>
// expected-error@above {{tokens count from 1, got [0]}}

// WRONG: verify-diagnostics.mlir.tmp.mlir:10:4: error: expected error "'logos.input' op has unknown output kind 'tokenz'" was not produced (on line 11)
// WRONG: verify-diagnostics.mlir.tmp.mlir:11:1: error: unexpected error: 'logos.input' op has unknown input kind 'tokenz'

// LINE: verify-diagnostics.mlir.tmp.line.mlir:10:4: error: expected error "'logos.input' op has unknown input kind 'tokenz'" was not produced (on line 12)
// LINE-NEXT: verify-diagnostics.mlir.tmp.line.mlir:11:1: error: unexpected error: 'logos.input' op has unknown input kind 'tokenz'
