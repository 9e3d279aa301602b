// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// Every op of the dialect, printed in its custom form and parsed back.

builtin.module {
  shard.grid @chips(shape = 2)
  %token = logos.input "token" values [3] : tensor<1xi64>
  %positions = logos.input "position" values [1, 2] : tensor<2xi64>
  %hidden = logos.input "hidden" : tensor<2x64xf32>
  %table = logos.weight "model.embed_tokens.weight" shape [256, 64] : tensor<256x64xf32>
  %norm = logos.weight "model.norm.weight" shape [64] : tensor<64xf32>
  %wq = logos.weight "model.layers.0.self_attn.q_proj.weight" shape [64, 64] split "rows" over @chips : tensor<32x64xf32>
  %wo = logos.weight "model.layers.0.self_attn.o_proj.weight" shape [64, 64] split "columns" over @chips : tensor<64x32xf32>
  %keys = logos.cache "key" layer 0 shape [2, 64, 16] split "heads" over @chips : memref<1x64x16xf32>
  %batch_keys = logos.cache "key" layer 0 shape [3, 2, 64, 16] : memref<3x2x64x16xf32>
  %x = logos.embed %table, %token : (tensor<256x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
  %n = logos.rms_norm %hidden, %norm epsilon 1.000000e-05 : f64 : (tensor<2x64xf32>, tensor<64xf32>) -> tensor<2x64xf32>
  %q = logos.linear %n, %wq : (tensor<2x64xf32>, tensor<32x64xf32>) -> tensor<2x32xf32>
  %r = logos.rope %q, %positions head_dim 16 theta 1.000000e+04 : f64 : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
  %s = logos.rope %q, %positions head_dim 16 theta 5.000000e+05 : f64 scaling <factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192> : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
  %t = logos.rope %q, %positions head_dim 16 theta 1.000000e+06 : f64 linear_scaling <factor = 8.0> : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
  %partial = logos.rope %q, %positions head_dim 16 rotary_dim 8 theta 1.000000e+04 : f64 : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
  %k = logos.linear %n, %wq : (tensor<2x64xf32>, tensor<32x64xf32>) -> tensor<2x32xf32>
  %half = logos.input "hidden" : tensor<2x16xf32>
  logos.cache_write %half, %keys, %positions : tensor<2x16xf32>, memref<1x64x16xf32>, tensor<2xi64>
  %a = logos.attention %r, %keys, %keys, %positions : (tensor<2x32xf32>, memref<1x64x16xf32>, memref<1x64x16xf32>, tensor<2xi64>) -> tensor<2x32xf32>
  %b = logos.self_attention %r, %k, %k head_dim 16 : (tensor<2x32xf32>, tensor<2x32xf32>, tensor<2x32xf32>) -> tensor<2x32xf32>
  %p = logos.linear %a, %wo : (tensor<2x32xf32>, tensor<64x32xf32>) -> tensor<2x64xf32>
  %sum = shard.all_reduce %p on @chips : tensor<2x64xf32> -> tensor<2x64xf32>
  %m = logos.add %hidden, %sum : tensor<2x64xf32>
  %g = logos.silu %m : tensor<2x64xf32>
  %u = logos.mul %g, %m : tensor<2x64xf32>
  %last = logos.row %u index 2 : (tensor<2x64xf32>) -> tensor<1x64xf32>
  %logits = logos.linear %last, %table : (tensor<1x64xf32>, tensor<256x64xf32>) -> tensor<1x256xf32>
  %next = logos.argmax %logits : (tensor<1x256xf32>) -> tensor<1xi64>
  %router = logos.weight "model.layers.0.mlp.gate.weight" shape [4, 64] : tensor<4x64xf32>
  %router_logits = logos.linear %m, %router : (tensor<2x64xf32>, tensor<4x64xf32>) -> tensor<2x4xf32>
  %gates = logos.weight "model.layers.0.mlp.experts.gate_proj.weight" shape [4, 32, 64] split "experts" over @chips : tensor<2x32x64xf32>
  %ups = logos.weight "model.layers.0.mlp.experts.up_proj.weight" shape [4, 32, 64] split "experts" over @chips : tensor<2x32x64xf32>
  %downs = logos.weight "model.layers.0.mlp.experts.down_proj.weight" shape [4, 64, 32] split "experts" over @chips : tensor<2x64x32xf32>
  %routed_part = logos.experts %m, %router_logits, %gates, %ups, %downs top_k 2 renormalize : (tensor<2x64xf32>, tensor<2x4xf32>, tensor<2x32x64xf32>, tensor<2x32x64xf32>, tensor<2x64x32xf32>) -> tensor<2x64xf32>
  %routed = shard.all_reduce %routed_part on @chips : tensor<2x64xf32> -> tensor<2x64xf32>
}

// CHECK:      shard.grid @chips(shape = 2)
// CHECK-NEXT: %token = logos.input "token" values [3] : tensor<1xi64>
// CHECK-NEXT: %positions = logos.input "position" values [1, 2] : tensor<2xi64>
// CHECK-NEXT: %hidden = logos.input "hidden" : tensor<2x64xf32>
// CHECK-NEXT: %table = logos.weight "model.embed_tokens.weight" shape [256, 64] : tensor<256x64xf32>
// CHECK-NEXT: %norm = logos.weight "model.norm.weight" shape [64] : tensor<64xf32>
// CHECK-NEXT: %wq = logos.weight "model.layers.0.self_attn.q_proj.weight" shape [64, 64] split "rows" over @chips : tensor<32x64xf32>
// CHECK-NEXT: %wo = logos.weight "model.layers.0.self_attn.o_proj.weight" shape [64, 64] split "columns" over @chips : tensor<64x32xf32>
// CHECK-NEXT: %keys = logos.cache "key" layer 0 shape [2, 64, 16] split "heads" over @chips : memref<1x64x16xf32>
// CHECK-NEXT: %batch_keys = logos.cache "key" layer 0 shape [3, 2, 64, 16] : memref<3x2x64x16xf32>
// CHECK-NEXT: %x = logos.embed %table, %token : (tensor<256x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
// CHECK-NEXT: %n = logos.rms_norm %hidden, %norm epsilon 1.000000e-05 : f64 : (tensor<2x64xf32>, tensor<64xf32>) -> tensor<2x64xf32>
// CHECK-NEXT: %q = logos.linear %n, %wq : (tensor<2x64xf32>, tensor<32x64xf32>) -> tensor<2x32xf32>
// CHECK-NEXT: %r = logos.rope %q, %positions head_dim 16 theta 1.000000e+04 : f64 : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
// CHECK-NEXT: %s = logos.rope %q, %positions head_dim 16 theta 5.000000e+05 : f64 scaling <factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192> : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
// CHECK-NEXT: %t = logos.rope %q, %positions head_dim 16 theta 1.000000e+06 : f64 linear_scaling <factor = 8.0> : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
// CHECK-NEXT: %partial = logos.rope %q, %positions head_dim 16 rotary_dim 8 theta 1.000000e+04 : f64 : (tensor<2x32xf32>, tensor<2xi64>) -> tensor<2x32xf32>
// CHECK-NEXT: %k = logos.linear %n, %wq : (tensor<2x64xf32>, tensor<32x64xf32>) -> tensor<2x32xf32>
// CHECK-NEXT: %half = logos.input "hidden" : tensor<2x16xf32>
// CHECK-NEXT: logos.cache_write %half, %keys, %positions : tensor<2x16xf32>, memref<1x64x16xf32>, tensor<2xi64>
// CHECK-NEXT: %a = logos.attention %r, %keys, %keys, %positions : (tensor<2x32xf32>, memref<1x64x16xf32>, memref<1x64x16xf32>, tensor<2xi64>) -> tensor<2x32xf32>
// CHECK-NEXT: %b = logos.self_attention %r, %k, %k head_dim 16 : (tensor<2x32xf32>, tensor<2x32xf32>, tensor<2x32xf32>) -> tensor<2x32xf32>
// CHECK-NEXT: %p = logos.linear %a, %wo : (tensor<2x32xf32>, tensor<64x32xf32>) -> tensor<2x64xf32>
// CHECK-NEXT: %sum = shard.all_reduce %p on @chips : tensor<2x64xf32> -> tensor<2x64xf32>
// CHECK-NEXT: %m = logos.add %hidden, %sum : tensor<2x64xf32>
// CHECK-NEXT: %g = logos.silu %m : tensor<2x64xf32>
// CHECK-NEXT: %u = logos.mul %g, %m : tensor<2x64xf32>
// CHECK-NEXT: %last = logos.row %u index 2 : (tensor<2x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %logits = logos.linear %last, %table : (tensor<1x64xf32>, tensor<256x64xf32>) -> tensor<1x256xf32>
// CHECK-NEXT: %next = logos.argmax %logits : (tensor<1x256xf32>) -> tensor<1xi64>
// CHECK-NEXT: %router = logos.weight "model.layers.0.mlp.gate.weight" shape [4, 64] : tensor<4x64xf32>
// CHECK-NEXT: %router_logits = logos.linear %m, %router : (tensor<2x64xf32>, tensor<4x64xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: %gates = logos.weight "model.layers.0.mlp.experts.gate_proj.weight" shape [4, 32, 64] split "experts" over @chips : tensor<2x32x64xf32>
// CHECK-NEXT: %ups = logos.weight "model.layers.0.mlp.experts.up_proj.weight" shape [4, 32, 64] split "experts" over @chips : tensor<2x32x64xf32>
// CHECK-NEXT: %downs = logos.weight "model.layers.0.mlp.experts.down_proj.weight" shape [4, 64, 32] split "experts" over @chips : tensor<2x64x32xf32>
// CHECK-NEXT: %routed_part = logos.experts %m, %router_logits, %gates, %ups, %downs top_k 2 renormalize : (tensor<2x64xf32>, tensor<2x4xf32>, tensor<2x32x64xf32>, tensor<2x32x64xf32>, tensor<2x64x32xf32>) -> tensor<2x64xf32>
// CHECK-NEXT: %routed = shard.all_reduce %routed_part on @chips : tensor<2x64xf32> -> tensor<2x64xf32>
