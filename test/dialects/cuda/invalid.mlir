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
