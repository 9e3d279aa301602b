// cuda-fold-prefill-norms: an RMS norm of several rows read only by projections that run on tensor cores (bf16
// weights) is folded into their prologue (x and the scale as inputs, `epsilon` set) and its launch and buffer go; a
// projection with f32 weights (CUDA cores) keeps the norm.
// RUN: %logos-opt %s --split-input-file -p cuda-fold-prefill-norms | %filecheck %s

// CHECK-LABEL: func.func @step() {
// CHECK-NOT:     cuda.rms_norm
// CHECK:         cuda.linear ins(%hidden, %wq, %scale : memref<4x64xf32>, memref<64x64xbf16>, memref<64xf32>) outs(%query : memref<4x64xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT:    cuda.linear ins(%hidden, %wk, %scale : memref<4x64xf32>, memref<32x64xbf16>, memref<64xf32>) outs(%key : memref<4x32xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT:    func.return
builtin.module attributes {cuda.identity = "test", cuda.weights = "bf16"} {
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<4x64xf32>
    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
    %normed = cuda.buffer "normed" kind "activation" : memref<4x64xf32>
    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xbf16>
    %query = cuda.buffer "query" kind "activation" : memref<4x64xf32>
    %wk = cuda.buffer "k.weight" kind "weight" : memref<32x64xbf16>
    %key = cuda.buffer "key" kind "activation" : memref<4x32xf32>
    cuda.rms_norm ins(%hidden, %scale : memref<4x64xf32>, memref<64xf32>) outs(%normed : memref<4x64xf32>) {epsilon = 1.0e-05 : f32, row = -1 : i64}
    cuda.linear ins(%normed, %wq : memref<4x64xf32>, memref<64x64xbf16>) outs(%query : memref<4x64xf32>)
    cuda.linear ins(%normed, %wk : memref<4x64xf32>, memref<32x64xbf16>) outs(%key : memref<4x32xf32>)
    func.return
  }
}

// -----

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
