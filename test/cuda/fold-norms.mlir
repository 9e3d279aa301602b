// cuda-fold-norms: a one-row RMS norm read only by projections as their input is folded into their prologue (each
// reads x and the scale, `epsilon` set) and its buffer goes; a norm of several rows, a row pick, or a norm read by
// anything but a projection's input stays a kernel.
// RUN: %logos-opt %s --split-input-file -p cuda-fold-norms | %filecheck %s

// CHECK-LABEL: func.func @step() {
// CHECK-NEXT:    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
// CHECK-NEXT:    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xf32>
// CHECK-NOT:     "normed"
// CHECK:         cuda.linear ins(%hidden, %wq, %scale : memref<1x64xf32>, memref<64x64xf32>, memref<64xf32>) outs(%query : memref<1x64xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT:    cuda.gate_up ins(%hidden, %wg, %wu, %scale : memref<1x64xf32>, memref<128x64xf32>, memref<128x64xf32>, memref<64xf32>) outs(%product : memref<1x128xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT:    func.return
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
    %normed = cuda.buffer "normed" kind "activation" : memref<1x64xf32>
    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xf32>
    %query = cuda.buffer "query" kind "activation" : memref<1x64xf32>
    %wg = cuda.buffer "gate.weight" kind "weight" : memref<128x64xf32>
    %wu = cuda.buffer "up.weight" kind "weight" : memref<128x64xf32>
    %product = cuda.buffer "product" kind "activation" : memref<1x128xf32>
    cuda.rms_norm ins(%hidden, %scale : memref<1x64xf32>, memref<64xf32>) outs(%normed : memref<1x64xf32>) {epsilon = 1.0e-05 : f32, row = -1 : i64}
    cuda.linear ins(%normed, %wq : memref<1x64xf32>, memref<64x64xf32>) outs(%query : memref<1x64xf32>)
    cuda.gate_up ins(%normed, %wg, %wu : memref<1x64xf32>, memref<128x64xf32>, memref<128x64xf32>) outs(%product : memref<1x128xf32>)
    func.return
  }
}

// -----

// Four rows: the norm stays.
// CHECK-LABEL: func.func @step() {
// CHECK:         cuda.rms_norm ins(%hidden, %scale : memref<4x64xf32>, memref<64xf32>) outs(%normed : memref<4x64xf32>)
// CHECK-NEXT:    cuda.linear ins(%normed, %wq : memref<4x64xf32>, memref<64x64xf32>) outs(%query : memref<4x64xf32>)
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<4x64xf32>
    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
    %normed = cuda.buffer "normed" kind "activation" : memref<4x64xf32>
    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xf32>
    %query = cuda.buffer "query" kind "activation" : memref<4x64xf32>
    cuda.rms_norm ins(%hidden, %scale : memref<4x64xf32>, memref<64xf32>) outs(%normed : memref<4x64xf32>) {epsilon = 1.0e-05 : f32, row = -1 : i64}
    cuda.linear ins(%normed, %wq : memref<4x64xf32>, memref<64x64xf32>) outs(%query : memref<4x64xf32>)
    func.return
  }
}

// -----

// Read by an add as well: the norm stays, and so does the projection.
// CHECK-LABEL: func.func @step() {
// CHECK:         cuda.rms_norm ins(%hidden, %scale
// CHECK-NEXT:    cuda.linear ins(%normed, %wq : memref<1x64xf32>, memref<64x64xf32>) outs(%query : memref<1x64xf32>)
// CHECK-NEXT:    cuda.add ins(%normed, %query
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
    %normed = cuda.buffer "normed" kind "activation" : memref<1x64xf32>
    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xf32>
    %query = cuda.buffer "query" kind "activation" : memref<1x64xf32>
    %sum = cuda.buffer "sum" kind "activation" : memref<1x64xf32>
    cuda.rms_norm ins(%hidden, %scale : memref<1x64xf32>, memref<64xf32>) outs(%normed : memref<1x64xf32>) {epsilon = 1.0e-05 : f32, row = -1 : i64}
    cuda.linear ins(%normed, %wq : memref<1x64xf32>, memref<64x64xf32>) outs(%query : memref<1x64xf32>)
    cuda.add ins(%normed, %query : memref<1x64xf32>, memref<1x64xf32>) outs(%sum : memref<1x64xf32>)
    func.return
  }
}
