// Flash attention over a tiny prefill chunk (4 rows, 4 query heads over 2 KV heads of 16, a bf16 cache of 64):
// cuda-fuse-prefill-attention folds the chunk's rope_cache_write and query rope into the attention they feed
// (cuda.prefill_attention) and builds one tensor-core kernel: queries rotated and rounded into shared memory, the
// chunk's keys rotated (values rounded) into the K/V tiles and written to the cache in the same pass, earlier
// positions by cp.async from the cache, S = Q K^T and O += P V on mma.sync, the online softmax over a quad's
// shuffles, P packed to bf16 from the accumulators, V read by ldmatrix .trans.
// RUN: %logos-opt %s -p cuda-fuse-prefill-attention,convert-cuda-kernels-to-gpu | %filecheck %s
// RUN: %logos-opt %s -p cuda-fuse-prefill-attention,convert-cuda-kernels-to-gpu -t cuda | %filecheck %s --check-prefix=CU

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

// CHECK-LABEL: "gpu.func"() <{function_type = (memref<4x64xf32>, memref<4x32xf32>, memref<4x32xf32>, memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>, memref<4x64xf32>, memref<2x64x16xbf16>, memref<2x64x16xbf16>) -> (), kernel}>
// CHECK:       %query_tile = cuda.shared_memory : memref<64x24xbf16, 3 : i64>
// CHECK:       scf.for
// CHECK:         memref.load %cos
// CHECK-NOT:     scf.yield
// CHECK:         cuda.pack_bf16x2
// CHECK-NEXT:    cuda.store_bf16x2 {{%.*}}, %query_tile[{{%.*}}, {{%.*}}] : memref<64x24xbf16, 3 : i64>
// CHECK:       %key_tile = cuda.shared_memory : memref<2x16x24xbf16, 3 : i64>
// CHECK-NEXT:  %value_tile = cuda.shared_memory : memref<2x16x24xbf16, 3 : i64>
// CHECK:       cuda.cp_async %key_tile[{{.*}}], %keys[{{.*}}]
// CHECK:       cuda.store_bf16x2 {{%.*}}, %key_tile[{{.*}}] : memref<2x16x24xbf16, 3 : i64>
// CHECK:         cuda.store_bf16x2 {{%.*}}, %keys[{{.*}}] : memref<2x64x16xbf16>
// CHECK:       cuda.cp_async_commit
// CHECK:       scf.for {{.*}} -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32) {
// CHECK:         cuda.cp_async_commit
// CHECK-NEXT:    cuda.cp_async_wait 1
// CHECK-NEXT:    "gpu.barrier"() : () -> ()
// CHECK:         [[Q0:%.*]], [[Q1:%.*]], [[Q2:%.*]], [[Q3:%.*]] = cuda.ldmatrix %query_tile
// CHECK-NEXT:    [[K0:%.*]], [[K1:%.*]], [[K2:%.*]], [[K3:%.*]] = cuda.ldmatrix %key_tile
// CHECK-NEXT:    cuda.mma_sync([[Q0]], [[Q1]], [[Q2]], [[Q3]]), ([[K0]], [[K1]]),
// CHECK-NEXT:    cuda.mma_sync([[Q0]], [[Q1]], [[Q2]], [[Q3]]), ([[K2]], [[K3]]),
// CHECK:         [[ONE:%.*]] = arith.constant 1 : i32
// CHECK:         "gpu.shuffle"({{%.*}}, [[ONE]], {{%.*}}) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
// CHECK:         [[TWO:%.*]] = arith.constant 2 : i32
// CHECK:         "gpu.shuffle"({{%.*}}, [[TWO]], {{%.*}}) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
// CHECK:         math.exp
// CHECK:         [[P0:%.*]] = cuda.pack_bf16x2
// CHECK-NEXT:    [[P1:%.*]] = cuda.pack_bf16x2
// CHECK-NEXT:    [[P2:%.*]] = cuda.pack_bf16x2
// CHECK-NEXT:    [[P3:%.*]] = cuda.pack_bf16x2
// CHECK-NEXT:    [[V0:%.*]], [[V1:%.*]], [[V2:%.*]], [[V3:%.*]] = cuda.ldmatrix %value_tile[{{.*}}] transpose
// CHECK-NEXT:    cuda.mma_sync([[P0]], [[P1]], [[P2]], [[P3]]), ([[V0]], [[V1]]),
// CHECK-NEXT:    cuda.mma_sync([[P0]], [[P1]], [[P2]], [[P3]]), ([[V2]], [[V3]]),
// CHECK-NEXT:    "gpu.barrier"() : () -> ()
// CHECK-NEXT:    scf.yield
// CHECK:       arith.divf
// CHECK:       memref.store {{%.*}}, %out[{{%.*}}, {{%.*}}] : memref<4x64xf32>
// CHECK:       sym_name = "prefill_attention_tc_4x64f32_4x32f32_4x32f32_4i64_64x16f32_64x16f32_4x64f32_2x64x16bf16_2x64x16bf16"
// CHECK-LABEL: func.func @step()
// CHECK-NOT:   cuda.rope
// CHECK:       "gpu.launch_func"({{.*}}, %q, %key, %value, %p, %cos, %sin, %o, %k, %v) <{kernel = @kernels::@prefill_attention_tc_
// CHECK-NOT:   gpu.launch_func

// CU-LABEL: __launch_bounds__(128, 2) prefill_attention_tc_4x64f32_4x32f32_4x32f32_4i64_64x16f32_64x16f32_4x64f32_2x64x16bf16_2x64x16bf16(
// CU:       __nv_bfloat16* __restrict__ keys,
// CU-NEXT:  __nv_bfloat16* __restrict__ values)
// CU:       __shared__ __align__(16) __nv_bfloat16 query_tile[1536];
// CU:       asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
// CU:       asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
