// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// Every op of the cuda dialect, printed in its custom form and parsed back (and the upstream ops it defines where
// xDSL 0.74 lacks them: gpu.shuffle and llvm.fence, added to xDSL's gpu and llvm by gpu_ext; nvvm.bar.warp.sync).

builtin.module {
  %x = cuda.buffer "x" kind "activation" : memref<2x64xf32>
  %w = cuda.buffer "model.layers.0.self_attn.q_proj.weight" kind "weight" : memref<64x64xbf16>
  %g = cuda.buffer "model.layers.0.mlp.gate_proj.weight" kind "weight" : memref<128x64xbf16>
  %u = cuda.buffer "model.layers.0.mlp.up_proj.weight" kind "weight" : memref<128x64xbf16>
  %n = cuda.buffer "model.norm.weight" kind "weight" : memref<64xf32>
  %tok = cuda.buffer "tokens" kind "input" : memref<2xi64>
  %pos = cuda.buffer "positions" kind "input" : memref<2xi64>
  %table = cuda.buffer "model.embed_tokens.weight" kind "weight" : memref<256x64xbf16>
  %cos = cuda.buffer "rope.cos" kind "table" : memref<64x16xf32>
  %sin = cuda.buffer "rope.sin" kind "table" : memref<64x16xf32>
  %k = cuda.buffer "key" kind "activation" : memref<2x32xf32>
  %v = cuda.buffer "value" kind "activation" : memref<2x32xf32>
  %kc = cuda.buffer "cache.key.0" kind "cache" : memref<2x64x16xf32>
  %vc = cuda.buffer "cache.value.0" kind "cache" : memref<2x64x16xf32>
  %q = cuda.buffer "query" kind "activation" : memref<2x64xf32>
  %o = cuda.buffer "out" kind "activation" : memref<2x64xf32>
  %p = cuda.buffer "product" kind "activation" : memref<2x128xf32>
  %ap = cuda.buffer "attention.partial" kind "scratch" : memref<2x4x2x18xf32>
  %ac = cuda.buffer "attention.count" kind "scratch" : memref<2x2xi64>
  %x1 = cuda.buffer "hidden" kind "activation" : memref<1x64xf32>
  %qkv = cuda.buffer "q+k+v" kind "weight" : memref<128x64xbf16>
  %q1 = cuda.buffer "turned_query" kind "activation" : memref<1x64xf32>
  %chip = cuda.buffer "chip" kind "table" : memref<1xi64>
  %p1 = cuda.buffer "position" kind "input" : memref<1xi64>
  %l = cuda.buffer "logits" kind "activation" : memref<2x256xf32>
  %next = cuda.buffer "next" kind "output" : memref<2xi64>
  %mp = cuda.buffer "argmax.partial" kind "scratch" : memref<2x1x2xf32>
  cuda.embed ins(%table, %tok : memref<256x64xbf16>, memref<2xi64>) outs(%x : memref<2x64xf32>)
  cuda.rms_norm ins(%x, %n : memref<2x64xf32>, memref<64xf32>) outs(%o : memref<2x64xf32>) {epsilon = 1.000000e-05 : f32, row = -1 : i64}
  cuda.linear ins(%o, %w : memref<2x64xf32>, memref<64x64xbf16>) outs(%q : memref<2x64xf32>)
  cuda.linear ins(%o, %w, %x : memref<2x64xf32>, memref<64x64xbf16>, memref<2x64xf32>) outs(%q : memref<2x64xf32>)
  cuda.gate_up ins(%o, %g, %u : memref<2x64xf32>, memref<128x64xbf16>, memref<128x64xbf16>) outs(%p : memref<2x128xf32>)
  cuda.rope ins(%q, %pos, %cos, %sin : memref<2x64xf32>, memref<2xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%o : memref<2x64xf32>) {head_dim = 16 : i64}
  cuda.rope_cache_write ins(%k, %v, %pos, %cos, %sin : memref<2x32xf32>, memref<2x32xf32>, memref<2xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%kc, %vc : memref<2x64x16xf32>, memref<2x64x16xf32>)
  cuda.attention ins(%q, %kc, %vc, %pos : memref<2x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2xi64>) outs(%o, %ap, %ac : memref<2x64xf32>, memref<2x4x2x18xf32>, memref<2x2xi64>) {split = 32 : i64}
  cuda.qkv ins(%x1, %qkv, %n, %p1, %cos, %sin : memref<1x64xf32>, memref<128x64xbf16>, memref<64xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%q1, %kc, %vc : memref<1x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>) {epsilon = 1.000000e-05 : f32}
  cuda.linear ins(%o, %w, %n : memref<2x64xf32>, memref<64x64xbf16>, memref<64xf32>) outs(%q : memref<2x64xf32>) {epsilon = 1.000000e-05 : f32}
  cuda.linear ins(%o, %w, %x, %chip : memref<2x64xf32>, memref<64x64xbf16>, memref<2x64xf32>, memref<1xi64>) outs(%q : memref<2x64xf32>) {residual_chip = 0 : i64}
  cuda.gate_up ins(%o, %g, %u, %n : memref<2x64xf32>, memref<128x64xbf16>, memref<128x64xbf16>, memref<64xf32>) outs(%p : memref<2x128xf32>) {epsilon = 1.000000e-05 : f32}
  cuda.add ins(%x, %q : memref<2x64xf32>, memref<2x64xf32>) outs(%o : memref<2x64xf32>)
  cuda.argmax ins(%l : memref<2x256xf32>) outs(%next, %mp : memref<2xi64>, memref<2x1x2xf32>) {chunk = 1024 : i64}
  %i = arith.constant 0 : index
  %w0 = arith.constant 1.0 : f32
  %c16 = arith.constant 16 : i32
  %c32 = arith.constant 32 : i32
  %r, %ok = "gpu.shuffle"(%w0, %c16, %c32) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
  "llvm.fence"() <{ordering = 7 : i64, syncscope = "device"}> : () -> ()
  %all = arith.constant -1 : i32
  "nvvm.bar.warp.sync"(%all) : (i32) -> ()
}

// CHECK:      %x = cuda.buffer "x" kind "activation" : memref<2x64xf32>
// CHECK:      cuda.embed ins(%table, %tok : memref<256x64xbf16>, memref<2xi64>) outs(%x : memref<2x64xf32>)
// CHECK-NEXT: cuda.rms_norm ins(%x, %n : memref<2x64xf32>, memref<64xf32>) outs(%o : memref<2x64xf32>) {epsilon = 1.000000e-05 : f32, row = -1 : i64}
// CHECK-NEXT: cuda.linear ins(%o, %w : memref<2x64xf32>, memref<64x64xbf16>) outs(%q : memref<2x64xf32>)
// CHECK-NEXT: cuda.linear ins(%o, %w, %x : memref<2x64xf32>, memref<64x64xbf16>, memref<2x64xf32>) outs(%q : memref<2x64xf32>)
// CHECK-NEXT: cuda.gate_up ins(%o, %g, %u : memref<2x64xf32>, memref<128x64xbf16>, memref<128x64xbf16>) outs(%p : memref<2x128xf32>)
// CHECK-NEXT: cuda.rope ins(%q, %pos, %cos, %sin : memref<2x64xf32>, memref<2xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%o : memref<2x64xf32>) {head_dim = 16 : i64}
// CHECK-NEXT: cuda.rope_cache_write ins(%k, %v, %pos, %cos, %sin : memref<2x32xf32>, memref<2x32xf32>, memref<2xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%kc, %vc : memref<2x64x16xf32>, memref<2x64x16xf32>)
// CHECK-NEXT: cuda.attention ins(%q, %kc, %vc, %pos : memref<2x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, memref<2xi64>) outs(%o, %ap, %ac : memref<2x64xf32>, memref<2x4x2x18xf32>, memref<2x2xi64>) {split = 32 : i64}
// CHECK-NEXT: cuda.qkv ins(%x1, %qkv, %n, %p1, %cos, %sin : memref<1x64xf32>, memref<128x64xbf16>, memref<64xf32>, memref<1xi64>, memref<64x16xf32>, memref<64x16xf32>) outs(%q1, %kc, %vc : memref<1x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT: cuda.linear ins(%o, %w, %n : memref<2x64xf32>, memref<64x64xbf16>, memref<64xf32>) outs(%q : memref<2x64xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT: cuda.linear ins(%o, %w, %x, %chip : memref<2x64xf32>, memref<64x64xbf16>, memref<2x64xf32>, memref<1xi64>) outs(%q : memref<2x64xf32>) {residual_chip = 0 : i64}
// CHECK-NEXT: cuda.gate_up ins(%o, %g, %u, %n : memref<2x64xf32>, memref<128x64xbf16>, memref<128x64xbf16>, memref<64xf32>) outs(%p : memref<2x128xf32>) {epsilon = 1.000000e-05 : f32}
// CHECK-NEXT: cuda.add ins(%x, %q : memref<2x64xf32>, memref<2x64xf32>) outs(%o : memref<2x64xf32>)
// CHECK-NEXT: cuda.argmax ins(%l : memref<2x256xf32>) outs(%next, %mp : memref<2xi64>, memref<2x1x2xf32>) {chunk = 1024 : i64}
// CHECK-NEXT: %i = arith.constant 0 : index
// CHECK:      %r, %ok = "gpu.shuffle"(%w0, %c16, %c32) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT: "llvm.fence"() <{ordering = 7 : i64, syncscope = "device"}> : () -> ()
// CHECK-NEXT: %all = arith.constant -1 : i32
// CHECK-NEXT: "nvvm.bar.warp.sync"(%all) : (i32) -> ()
