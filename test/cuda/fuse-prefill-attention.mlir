// cuda-fuse-prefill-attention: a prefill chunk's key rotation and cache writes and its query rotation, directly
// before the attention they feed (a bf16 cache, several rows), become one cuda.prefill_attention: the chunk's keys
// and values are written to the cache in the attention's own pass; the rotated queries' buffer and the attention's
// scratch go. An f32 cache (no tensor-core flash attention) keeps the three steps.
// RUN: %logos-opt %s --split-input-file -p cuda-fuse-prefill-attention | %filecheck %s

// CHECK-LABEL: func.func @step() {
// CHECK-NEXT:    %q = cuda.buffer "query" kind "activation" : memref<4x64xf32>
// CHECK-NEXT:    %key = cuda.buffer "key" kind "activation" : memref<4x32xf32>
// CHECK-NEXT:    %value = cuda.buffer "value" kind "activation" : memref<4x32xf32>
// CHECK-NEXT:    %k = cuda.buffer "cache.key.0" kind "cache" : memref<2x64x16xbf16>
// CHECK-NEXT:    %v = cuda.buffer "cache.value.0" kind "cache" : memref<2x64x16xbf16>
// CHECK-NEXT:    %p = cuda.buffer "positions" kind "input" : memref<4xi64>
// CHECK-NEXT:    %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
// CHECK-NEXT:    %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
// CHECK-NEXT:    %o = cuda.buffer "attended" kind "activation" : memref<4x64xf32>
// CHECK-NEXT:    cuda.prefill_attention ins(%q, %key, %value, %p, %cos, %sin : memref<4x64xf32>, memref<4x32xf32>, memref<4x32xf32>, memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%o, %k, %v : memref<4x64xf32>, memref<2x64x16xbf16>, memref<2x64x16xbf16>)
// CHECK-NEXT:    func.return
builtin.module attributes {cuda.identity = "test", cuda.weights = "bf16"} {
  func.func @step() {
    %q = cuda.buffer "query" kind "activation" : memref<4x64xf32>
    %key = cuda.buffer "key" kind "activation" : memref<4x32xf32>
    %value = cuda.buffer "value" kind "activation" : memref<4x32xf32>
    %tq = cuda.buffer "turned_query" kind "activation" : memref<4x64xf32>
    %k = cuda.buffer "cache.key.0" kind "cache" : memref<2x64x16xbf16>
    %v = cuda.buffer "cache.value.0" kind "cache" : memref<2x64x16xbf16>
    %p = cuda.buffer "positions" kind "input" : memref<4xi64>
    %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
    %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
    %o = cuda.buffer "attended" kind "activation" : memref<4x64xf32>
    %s = cuda.buffer "attention.partial" kind "scratch" : memref<4x4x2x18xf32>
    %c = cuda.buffer "attention.count" kind "scratch" : memref<4x2xi64>
    cuda.rope_cache_write ins(%key, %value, %p, %cos, %sin : memref<4x32xf32>, memref<4x32xf32>, memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%k, %v : memref<2x64x16xbf16>, memref<2x64x16xbf16>)
    cuda.rope ins(%q, %p, %cos, %sin : memref<4x64xf32>, memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%tq : memref<4x64xf32>) {head_dim = 16 : i64}
    cuda.attention ins(%tq, %k, %v, %p : memref<4x64xf32>, memref<2x64x16xbf16>, memref<2x64x16xbf16>, memref<4xi64>) outs(%o, %s, %c : memref<4x64xf32>, memref<4x4x2x18xf32>, memref<4x2xi64>) {split = 32 : i64}
    func.return
  }
}

// -----

// CHECK-LABEL: func.func @step() {
// CHECK-NOT:     cuda.prefill_attention
// CHECK:         cuda.rope_cache_write
// CHECK-NEXT:    cuda.rope
// CHECK-NEXT:    cuda.attention
builtin.module attributes {cuda.identity = "test", cuda.weights = "f32"} {
  func.func @step() {
    %q = cuda.buffer "query" kind "activation" : memref<4x64xf32>
    %key = cuda.buffer "key" kind "activation" : memref<4x32xf32>
    %value = cuda.buffer "value" kind "activation" : memref<4x32xf32>
    %tq = cuda.buffer "turned_query" kind "activation" : memref<4x64xf32>
    %k = cuda.buffer "cache.key.0" kind "cache" : memref<2x64x16xf32>
    %v = cuda.buffer "cache.value.0" kind "cache" : memref<2x64x16xf32>
    %p = cuda.buffer "positions" kind "input" : memref<4xi64>
    %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
    %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
    %o = cuda.buffer "attended" kind "activation" : memref<4x64xf32>
    %s = cuda.buffer "attention.partial" kind "scratch" : memref<4x4x2x18xf32>
    %c = cuda.buffer "attention.count" kind "scratch" : memref<4x2xi64>
    cuda.rope_cache_write ins(%key, %value, %p, %cos, %sin : memref<4x32xf32>, memref<4x32xf32>, memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%k, %v : memref<2x64x16xf32>, memref<2x64x16xf32>)
    cuda.rope ins(%q, %p, %cos, %sin : memref<4x64xf32>, memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%tq : memref<4x64xf32>) {head_dim = 16 : i64}
    cuda.attention ins(%tq, %k, %v, %p : memref<4x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<4xi64>) outs(%o, %s, %c : memref<4x64xf32>, memref<4x4x2x18xf32>, memref<4x2xi64>) {split = 32 : i64}
    func.return
  }
}
