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

// A mixture of experts: the route, an expert's matvec over its stack, the weighted sum.

d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %mixed = d5005.buffer "mixed" words 64 at 0 in "inputs"
  %router = d5005.buffer "router_logits" words 4 at 0 in "outputs"
  %gate = d5005.buffer "expert_gate" words 32 at 16 in "outputs"
  %down = d5005.buffer "expert_down" words 64 at 48 in "outputs"
  %routed = d5005.buffer "routed" words 64 at 0 in "attended"
  d5005.matvec %router, %mixed, <"router" at 0 stride 128 rows 4 cols 64 bytes 2>
  d5005.route %router, <"routes" at 8192 stride 64 rows 4 cols 2 bytes 4> experts 4 top_k 2 renormalize
  d5005.matvec %gate, %mixed, <"experts.gate" at 128 stride 128 rows 128 cols 64 bytes 2> expert slot 1 of 4 routes <"routes" at 8192 stride 64 rows 4 cols 2 bytes 4>
  d5005.expert_sum %routed, %down slot 1 size 64
}

// CHECK-LABEL: d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
// CHECK-NEXT:     %mixed = d5005.buffer "mixed" words 64 at 0 in "inputs"
// CHECK-NEXT:     %router = d5005.buffer "router_logits" words 4 at 0 in "outputs"
// CHECK-NEXT:     %gate = d5005.buffer "expert_gate" words 32 at 16 in "outputs"
// CHECK-NEXT:     %down = d5005.buffer "expert_down" words 64 at 48 in "outputs"
// CHECK-NEXT:     %routed = d5005.buffer "routed" words 64 at 0 in "attended"
// CHECK-NEXT:     d5005.matvec %router, %mixed, <"router" at 0 stride 128 rows 4 cols 64 bytes 2>
// CHECK-NEXT:     d5005.route %router, <"routes" at 8192 stride 64 rows 4 cols 2 bytes 4> experts 4 top_k 2 renormalize
// CHECK-NEXT:     d5005.matvec %gate, %mixed, <"experts.gate" at 128 stride 128 rows 128 cols 64 bytes 2> expert slot 1 of 4 routes <"routes" at 8192 stride 64 rows 4 cols 2 bytes 4>
// CHECK-NEXT:     d5005.expert_sum %routed, %down slot 1 size 64
// CHECK-NEXT:   }
// CHECK-NEXT: }
