// cuda-fold-residual-adds: add(h, linear(x, w)) becomes linear(x, w, h) writing the add's result (the add's launch
// and the projection's own buffer go) when nothing reads the projection's result again; in a split program,
// add(h, all_reduce(linear(x, w))) becomes all_reduce(linear(x, w, h, chip)) with the residual added on chip 0 alone (`residual_chip`, the host's `chip` table added after the other
// buffers): the all-reduce completes the residual stream, the add's launch and buffer go, and the kernels that read
// the add's result read the reduced buffer.
// RUN: %logos-opt %s --split-input-file -p cuda-fold-residual-adds | %filecheck %s

// CHECK-LABEL: func.func @step() {
// CHECK-NEXT:    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %attended = cuda.buffer "attended" kind "activation" : memref<1x32xf32>
// CHECK-NEXT:    %wo = cuda.buffer "o.weight" kind "weight" : memref<64x32xf32>
// CHECK-NEXT:    %part = cuda.buffer "projected_part" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %wg = cuda.buffer "gate.weight" kind "weight" : memref<64x64xf32>
// CHECK-NEXT:    %wu = cuda.buffer "up.weight" kind "weight" : memref<64x64xf32>
// CHECK-NEXT:    %product = cuda.buffer "product" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %chip = cuda.buffer "chip" kind "table" : memref<1xi64>
// CHECK-NEXT:    cuda.linear ins(%attended, %wo, %hidden, %chip : memref<1x32xf32>, memref<64x32xf32>, memref<1x64xf32>, memref<1xi64>) outs(%part : memref<1x64xf32>) {residual_chip = 0 : i64}
// CHECK-NEXT:    %reduced = shard.all_reduce %part on @chips grid_axes = [0] : memref<1x64xf32> -> memref<1x64xf32>
// CHECK-NEXT:    cuda.gate_up ins(%reduced, %wg, %wu : memref<1x64xf32>, memref<64x64xf32>, memref<64x64xf32>) outs(%product : memref<1x64xf32>)
// CHECK-NEXT:    func.return
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  shard.grid @chips(shape = 2)
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %attended = cuda.buffer "attended" kind "activation" : memref<1x32xf32>
    %wo = cuda.buffer "o.weight" kind "weight" : memref<64x32xf32>
    %part = cuda.buffer "projected_part" kind "activation" : memref<1x64xf32>
    %mixed = cuda.buffer "mixed" kind "activation" : memref<1x64xf32>
    %wg = cuda.buffer "gate.weight" kind "weight" : memref<64x64xf32>
    %wu = cuda.buffer "up.weight" kind "weight" : memref<64x64xf32>
    %product = cuda.buffer "product" kind "activation" : memref<1x64xf32>
    cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%part : memref<1x64xf32>)
    %reduced = shard.all_reduce %part on @chips grid_axes = [0] : memref<1x64xf32> -> memref<1x64xf32>
    cuda.add ins(%hidden, %reduced : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
    cuda.gate_up ins(%mixed, %wg, %wu : memref<1x64xf32>, memref<64x64xf32>, memref<64x64xf32>) outs(%product : memref<1x64xf32>)
    func.return
  }
}

// -----

// The partial sum rewritten while the add's result is still read: the add stays.
// CHECK-LABEL: func.func @step() {
// CHECK:         cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%part : memref<1x64xf32>)
// CHECK-NEXT:    %reduced = shard.all_reduce %part
// CHECK-NEXT:    cuda.add ins(%hidden, %reduced : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  shard.grid @chips(shape = 2)
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %attended = cuda.buffer "attended" kind "activation" : memref<1x32xf32>
    %wo = cuda.buffer "o.weight" kind "weight" : memref<64x32xf32>
    %part = cuda.buffer "projected_part" kind "activation" : memref<1x64xf32>
    %mixed = cuda.buffer "mixed" kind "activation" : memref<1x64xf32>
    %w2 = cuda.buffer "down.weight" kind "weight" : memref<64x64xf32>
    %out = cuda.buffer "out" kind "activation" : memref<1x64xf32>
    cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%part : memref<1x64xf32>)
    %reduced = shard.all_reduce %part on @chips grid_axes = [0] : memref<1x64xf32> -> memref<1x64xf32>
    cuda.add ins(%hidden, %reduced : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
    cuda.linear ins(%hidden, %w2 : memref<1x64xf32>, memref<64x64xf32>) outs(%part : memref<1x64xf32>)
    cuda.linear ins(%mixed, %w2 : memref<1x64xf32>, memref<64x64xf32>) outs(%out : memref<1x64xf32>)
    func.return
  }
}

// -----

// Unsplit: the residual add right after the projection of its right-hand side goes into that projection.
// CHECK-LABEL: func.func @step() {
// CHECK-NEXT:    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %attended = cuda.buffer "attended" kind "activation" : memref<1x32xf32>
// CHECK-NEXT:    %wo = cuda.buffer "o.weight" kind "weight" : memref<64x32xf32>
// CHECK-NEXT:    %mixed = cuda.buffer "mixed" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %wg = cuda.buffer "gate.weight" kind "weight" : memref<64x64xf32>
// CHECK-NEXT:    %wu = cuda.buffer "up.weight" kind "weight" : memref<64x64xf32>
// CHECK-NEXT:    %product = cuda.buffer "product" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    cuda.linear ins(%attended, %wo, %hidden : memref<1x32xf32>, memref<64x32xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
// CHECK-NEXT:    cuda.gate_up ins(%mixed, %wg, %wu : memref<1x64xf32>, memref<64x64xf32>, memref<64x64xf32>) outs(%product : memref<1x64xf32>)
// CHECK-NEXT:    func.return
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %attended = cuda.buffer "attended" kind "activation" : memref<1x32xf32>
    %wo = cuda.buffer "o.weight" kind "weight" : memref<64x32xf32>
    %projected = cuda.buffer "projected" kind "activation" : memref<1x64xf32>
    %mixed = cuda.buffer "mixed" kind "activation" : memref<1x64xf32>
    %wg = cuda.buffer "gate.weight" kind "weight" : memref<64x64xf32>
    %wu = cuda.buffer "up.weight" kind "weight" : memref<64x64xf32>
    %product = cuda.buffer "product" kind "activation" : memref<1x64xf32>
    cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%projected : memref<1x64xf32>)
    cuda.add ins(%hidden, %projected : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
    cuda.gate_up ins(%mixed, %wg, %wu : memref<1x64xf32>, memref<64x64xf32>, memref<64x64xf32>) outs(%product : memref<1x64xf32>)
    func.return
  }
}

// -----

// Unsplit, the projection's result read again after the add (or the projection's result as the add's left-hand
// side): the adds stay.
// CHECK-LABEL: func.func @step() {
// CHECK:         cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%projected : memref<1x64xf32>)
// CHECK-NEXT:    cuda.add ins(%hidden, %projected : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
// CHECK-NEXT:    cuda.gate_up ins(%projected, %wg, %wu
// CHECK-NEXT:    cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%projected : memref<1x64xf32>)
// CHECK-NEXT:    cuda.add ins(%projected, %hidden : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %hidden = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %attended = cuda.buffer "attended" kind "activation" : memref<1x32xf32>
    %wo = cuda.buffer "o.weight" kind "weight" : memref<64x32xf32>
    %projected = cuda.buffer "projected" kind "activation" : memref<1x64xf32>
    %mixed = cuda.buffer "mixed" kind "activation" : memref<1x64xf32>
    %wg = cuda.buffer "gate.weight" kind "weight" : memref<64x64xf32>
    %wu = cuda.buffer "up.weight" kind "weight" : memref<64x64xf32>
    %product = cuda.buffer "product" kind "activation" : memref<1x64xf32>
    cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%projected : memref<1x64xf32>)
    cuda.add ins(%hidden, %projected : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
    cuda.gate_up ins(%projected, %wg, %wu : memref<1x64xf32>, memref<64x64xf32>, memref<64x64xf32>) outs(%product : memref<1x64xf32>)
    cuda.linear ins(%attended, %wo : memref<1x32xf32>, memref<64x32xf32>) outs(%projected : memref<1x64xf32>)
    cuda.add ins(%projected, %hidden : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
    func.return
  }
}
