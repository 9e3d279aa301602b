// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// Every op of the dialect (and the #d5005.region attribute), printed in its custom form and parsed back.

d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %x = d5005.buffer "x" words 64 at 0 in "residual"
  %normed = d5005.buffer "normed" words 64 at 0 in "inputs"
  %q = d5005.buffer "q" words 64 at 0 in "outputs"
  %turned = d5005.buffer "turned" words 64 at 0 in "rotated"
  %attended = d5005.buffer "attended" words 64 at 0 in "attended"
  %sum = d5005.buffer "sum" words 64 at 64 in "residual"
  %product = d5005.buffer "product" words 64 at 64 in "inputs"
  %logits = d5005.buffer "logits" words 256 at 64 in "outputs"
  d5005.embed_row %x, <"model.embed_tokens.weight" at 0 stride 128 rows 256 cols 64 bytes 2>
  d5005.rms_norm %normed, %x, <"model.norm.weight" at 8192 stride 128 rows 1 cols 64 bytes 2> epsilon 1.0e-05 : f32
  d5005.matvec %q, %normed, <"q_proj" at 8320 stride 128 rows 64 cols 64 bytes 2>
  d5005.rope %turned, %q, <"rope" at 10368 stride 128 rows 64 cols 32 bytes 4> width 64 head_dim 16
  d5005.cache_write %turned, <"cache.0.key" at 11392 stride 64 rows 256 cols 16 bytes 2> kv_heads 4
  d5005.attention %attended, %turned, <"cache.0.key" at 11392 stride 64 rows 256 cols 16 bytes 2>, <"cache.0.value" at 15488 stride 64 rows 256 cols 16 bytes 2> current %turned, %q heads 4 kv_heads 4
  d5005.add %sum, %x, %q size 64
  d5005.silu_mul %product, %q, %q size 64
  d5005.matvec %logits, %attended, <"lm_head.weight" at 19584 stride 128 rows 256 cols 64 bytes 2>
  d5005.argmax %logits size 256
}

// CHECK-LABEL: d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
// CHECK-NEXT:     %x = d5005.buffer "x" words 64 at 0 in "residual"
// CHECK-NEXT:     %normed = d5005.buffer "normed" words 64 at 0 in "inputs"
// CHECK-NEXT:     %q = d5005.buffer "q" words 64 at 0 in "outputs"
// CHECK-NEXT:     %turned = d5005.buffer "turned" words 64 at 0 in "rotated"
// CHECK-NEXT:     %attended = d5005.buffer "attended" words 64 at 0 in "attended"
// CHECK-NEXT:     %sum = d5005.buffer "sum" words 64 at 64 in "residual"
// CHECK-NEXT:     %product = d5005.buffer "product" words 64 at 64 in "inputs"
// CHECK-NEXT:     %logits = d5005.buffer "logits" words 256 at 64 in "outputs"
// CHECK-NEXT:     d5005.embed_row %x, <"model.embed_tokens.weight" at 0 stride 128 rows 256 cols 64 bytes 2>
// CHECK-NEXT:     d5005.rms_norm %normed, %x, <"model.norm.weight" at 8192 stride 128 rows 1 cols 64 bytes 2> epsilon 1.000000e-05 : f32
// CHECK-NEXT:     d5005.matvec %q, %normed, <"q_proj" at 8320 stride 128 rows 64 cols 64 bytes 2>
// CHECK-NEXT:     d5005.rope %turned, %q, <"rope" at 10368 stride 128 rows 64 cols 32 bytes 4> width 64 head_dim 16
// CHECK-NEXT:     d5005.cache_write %turned, <"cache.0.key" at 11392 stride 64 rows 256 cols 16 bytes 2> kv_heads 4
// CHECK-NEXT:     d5005.attention %attended, %turned, <"cache.0.key" at 11392 stride 64 rows 256 cols 16 bytes 2>, <"cache.0.value" at 15488 stride 64 rows 256 cols 16 bytes 2> current %turned, %q heads 4 kv_heads 4
// CHECK-NEXT:     d5005.add %sum, %x, %q size 64
// CHECK-NEXT:     d5005.silu_mul %product, %q, %q size 64
// CHECK-NEXT:     d5005.matvec %logits, %attended, <"lm_head.weight" at 19584 stride 128 rows 256 cols 64 bytes 2>
// CHECK-NEXT:     d5005.argmax %logits size 256
// CHECK-NEXT:   }
// CHECK-NEXT: }
