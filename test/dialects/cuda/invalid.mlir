// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// One verifier diagnostic per case: each names the op and what is wrong.

// CHECK: 'cuda.buffer' op has unknown buffer kind 'heap' (expected one of weight, cache, activation, input, output, table, scratch)
%x = cuda.buffer "x" kind "heap" : memref<2x64xf32>
// -----
// CHECK: 'cuda.linear' op input width mismatch: got 64, expected 32
%x = cuda.buffer "x" kind "activation" : memref<1x64xf32>
%w = cuda.buffer "w" kind "weight" : memref<64x32xbf16>
%o = cuda.buffer "o" kind "activation" : memref<1x64xf32>
cuda.linear ins(%x, %w : memref<1x64xf32>, memref<64x32xbf16>) outs(%o : memref<1x64xf32>)
// -----
// CHECK: 'cuda.gate_up' op takes 3 inputs (and a norm scale) and 1 output, got 2 and 1
%x = cuda.buffer "x" kind "activation" : memref<1x64xf32>
%w = cuda.buffer "w" kind "weight" : memref<128x64xbf16>
%o = cuda.buffer "o" kind "activation" : memref<1x128xf32>
cuda.gate_up ins(%x, %w : memref<1x64xf32>, memref<128x64xbf16>) outs(%o : memref<1x128xf32>)
// -----
// CHECK: 'cuda.attention' op scratch shape mismatch: got (1, 4, 1, 18), expected (1, 4, 2, 18)
%q = cuda.buffer "q" kind "activation" : memref<1x64xf32>
%k = cuda.buffer "k" kind "cache" : memref<2x64x16xf32>
%p = cuda.buffer "p" kind "input" : memref<1xi64>
%o = cuda.buffer "o" kind "activation" : memref<1x64xf32>
%s = cuda.buffer "s" kind "scratch" : memref<1x4x1x18xf32>
%c = cuda.buffer "c" kind "scratch" : memref<1x2xi64>
cuda.attention ins(%q, %k, %k, %p : memref<1x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<1xi64>) outs(%o, %s, %c : memref<1x64xf32>, memref<1x4x1x18xf32>, memref<1x2xi64>) {split = 32 : i64}
// -----
// CHECK: 'llvm.fence' op orders as acquire (4), release (5), acq_rel (6) or seq_cst (7), not 2
"llvm.fence"() <{ordering = 2 : i64, syncscope = "device"}> : () -> ()
// -----
// CHECK: 'gpu.shuffle' op takes its offset as i32, not i64
%v = arith.constant 1.0 : f32
%c16 = arith.constant 16 : i64
%c32 = arith.constant 32 : i32
%r, %ok = "gpu.shuffle"(%v, %c16, %c32) <{mode = #gpu<shuffle_mode xor>}> : (f32, i64, i32) -> (f32, i1)
// -----
// CHECK: 'cuda.linear' op adds its residual on one chip: it needs a residual
%x = cuda.buffer "x" kind "activation" : memref<1x64xf32>
%w = cuda.buffer "w" kind "weight" : memref<64x64xbf16>
%c = cuda.buffer "chip" kind "table" : memref<1xi64>
%o = cuda.buffer "o" kind "activation" : memref<1x64xf32>
cuda.linear ins(%x, %w, %c : memref<1x64xf32>, memref<64x64xbf16>, memref<1xi64>) outs(%o : memref<1x64xf32>) {residual_chip = 0 : i64}
// -----
// CHECK: 'cuda.tma_load' op needs a box row of 128 bytes to swizzle, not 32 elements
%x = cuda.buffer "x" kind "scratch" : memref<200x128xbf16>
%ring = cuda.shared_memory : memref<4x128x32xbf16, 3 : i64>
%full = cuda.shared_memory : memref<4xi64, 3 : i64>
%i = arith.constant 0 : index
cuda.tma_load %ring[%i, %i, %i], %full[%i], %x[%i, %i] box 128 x 32 swizzle 128 : memref<4x128x32xbf16, 3 : i64>, memref<4xi64, 3 : i64>, memref<200x128xbf16>
// -----
// CHECK: 'cuda.mbarrier_init' op takes mbarriers of i64 (a .b64 each), not f32
%bars = cuda.shared_memory : memref<4xf32, 3 : i64>
%i = arith.constant 0 : index
cuda.mbarrier_init %bars[%i], 1 : memref<4xf32, 3 : i64>
// -----
// CHECK: 'cuda.wgmma' op m64n16k16 takes and gives 8 f32 registers, not 4, 8
%ring = cuda.shared_memory : memref<4x128x64xbf16, 3 : i64>
%i = arith.constant 0 : index
%a = cuda.wgmma_descriptor %ring[%i, %i, %i] leading 16 stride 1024 swizzle 128 : memref<4x128x64xbf16, 3 : i64>
%z = arith.constant 0.0 : f32
%d0, %d1, %d2, %d3, %d4, %d5, %d6, %d7 = "cuda.wgmma"(%a, %a, %z, %z, %z, %z) <{n = 16 : i64}> : (i64, i64, f32, f32, f32, f32) -> (f32, f32, f32, f32, f32, f32, f32, f32)
// -----
// CHECK: 'cuda.wgmma_descriptor' op needs a stride byte offset of whole 16 bytes below 2^18, not 1000
%ring = cuda.shared_memory : memref<4x128x64xbf16, 3 : i64>
%i = arith.constant 0 : index
%a = cuda.wgmma_descriptor %ring[%i, %i, %i] leading 16 stride 1000 swizzle 128 : memref<4x128x64xbf16, 3 : i64>
