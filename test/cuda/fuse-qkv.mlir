// cuda-fuse-qkv: a decode layer's query, key and value projections (one row, the norm folded), the rotation of
// the keys with both cache writes and the rotation of the queries become one cuda.qkv on one weight buffer holding
// the three weights one after the other (named by all three, added after the other buffers); the buffers only
// the fused steps used go (the three weights, the projections' results). A batch (a cache per sequence) keeps
// its steps apart.
// RUN: %logos-opt %s --split-input-file -p cuda-fuse-qkv | %filecheck %s

// CHECK-LABEL: func.func @step() {
// CHECK-NEXT:    %x = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
// CHECK-NEXT:    %keys = cuda.buffer "cache.key.0" kind "cache" : memref<2x64x16xf32>
// CHECK-NEXT:    %values = cuda.buffer "cache.value.0" kind "cache" : memref<2x64x16xf32>
// CHECK-NEXT:    %position = cuda.buffer "position" kind "input" : memref<1xi64>
// CHECK-NEXT:    %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
// CHECK-NEXT:    %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
// CHECK-NEXT:    %turned = cuda.buffer "turned_query" kind "activation" : memref<1x64xf32>
// CHECK-NEXT:    %q_weight = cuda.buffer "q.weight+k.weight+v.weight" kind "weight" : memref<128x64xf32>
// CHECK-NEXT:    cuda.qkv ins(%x, %q_weight, %scale, %position, %cos, %sin : memref<1x64xf32>, memref<128x64xf32>, memref<64xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%turned, %keys, %values : memref<1x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT:    func.return
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %x = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xf32>
    %q = cuda.buffer "query" kind "activation" : memref<1x64xf32>
    %wk = cuda.buffer "k.weight" kind "weight" : memref<32x64xf32>
    %k = cuda.buffer "key" kind "activation" : memref<1x32xf32>
    %wv = cuda.buffer "v.weight" kind "weight" : memref<32x64xf32>
    %v = cuda.buffer "value" kind "activation" : memref<1x32xf32>
    %keys = cuda.buffer "cache.key.0" kind "cache" : memref<2x64x16xf32>
    %values = cuda.buffer "cache.value.0" kind "cache" : memref<2x64x16xf32>
    %position = cuda.buffer "position" kind "input" : memref<1xi64>
    %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
    %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
    %turned = cuda.buffer "turned_query" kind "activation" : memref<1x64xf32>
    cuda.linear ins(%x, %wq, %scale : memref<1x64xf32>, memref<64x64xf32>, memref<64xf32>) outs(%q : memref<1x64xf32>) {epsilon = 1.0e-05 : f32}
    cuda.linear ins(%x, %wk, %scale : memref<1x64xf32>, memref<32x64xf32>, memref<64xf32>) outs(%k : memref<1x32xf32>) {epsilon = 1.0e-05 : f32}
    cuda.linear ins(%x, %wv, %scale : memref<1x64xf32>, memref<32x64xf32>, memref<64xf32>) outs(%v : memref<1x32xf32>) {epsilon = 1.0e-05 : f32}
    cuda.rope_cache_write ins(%k, %v, %position, %cos, %sin : memref<1x32xf32>, memref<1x32xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%keys, %values : memref<2x64x16xf32>, memref<2x64x16xf32>)
    cuda.rope ins(%q, %position, %cos, %sin : memref<1x64xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%turned : memref<1x64xf32>) {head_dim = 16 : i64}
    func.return
  }
}

// -----

// A batch of two sequences (a cache each): no fusion.
// CHECK-LABEL: func.func @step() {
// CHECK-NOT:     cuda.qkv
// CHECK:         cuda.rope_cache_write
// CHECK-NEXT:    cuda.rope
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %x = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
    %scale = cuda.buffer "norm.weight" kind "weight" : memref<64xf32>
    %wq = cuda.buffer "q.weight" kind "weight" : memref<64x64xf32>
    %q = cuda.buffer "query" kind "activation" : memref<1x64xf32>
    %wk = cuda.buffer "k.weight" kind "weight" : memref<32x64xf32>
    %k = cuda.buffer "key" kind "activation" : memref<1x32xf32>
    %wv = cuda.buffer "v.weight" kind "weight" : memref<32x64xf32>
    %v = cuda.buffer "value" kind "activation" : memref<1x32xf32>
    %keys = cuda.buffer "cache.key.0" kind "cache" : memref<1x2x64x16xf32>
    %values = cuda.buffer "cache.value.0" kind "cache" : memref<1x2x64x16xf32>
    %position = cuda.buffer "position" kind "input" : memref<1xi64>
    %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
    %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
    %turned = cuda.buffer "turned_query" kind "activation" : memref<1x64xf32>
    cuda.linear ins(%x, %wq, %scale : memref<1x64xf32>, memref<64x64xf32>, memref<64xf32>) outs(%q : memref<1x64xf32>) {epsilon = 1.0e-05 : f32}
    cuda.linear ins(%x, %wk, %scale : memref<1x64xf32>, memref<32x64xf32>, memref<64xf32>) outs(%k : memref<1x32xf32>) {epsilon = 1.0e-05 : f32}
    cuda.linear ins(%x, %wv, %scale : memref<1x64xf32>, memref<32x64xf32>, memref<64xf32>) outs(%v : memref<1x32xf32>) {epsilon = 1.0e-05 : f32}
    cuda.rope_cache_write ins(%k, %v, %position, %cos, %sin : memref<1x32xf32>, memref<1x32xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%keys, %values : memref<1x2x64x16xf32>, memref<1x2x64x16xf32>)
    cuda.rope ins(%q, %position, %cos, %sin : memref<1x64xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%turned : memref<1x64xf32>) {head_dim = 16 : i64}
    func.return
  }
}
