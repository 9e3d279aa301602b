// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// Every op of the dialect (the tiny model's embedding, a layer and the head as convert-logos-to-spatial places
// them, side by side on one grid), printed in its custom form and parsed back.

// CHECK: builtin.module {
// CHECK: spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
// CHECK-LABEL: spatial.region @embedding on @wse2 origin [0, 0] size [4, 16] cut "decode_embed" identity "LOGOS program: decode step's embedding, sha256 {{[0-9a-f]+}}" weights "f16" {
// CHECK-NEXT: %table = spatial.place "model.embed_tokens.weight" shape [256, 64] at [0, 0, 4, 16] tile [16, 16] : tensor<256x64xf16>
// CHECK-NEXT: %token = spatial.receive "token" from "host" colours [0] out [0, 0, 1, 0, 1, 1] : tensor<1xi64>
// CHECK-NEXT: %hidden = spatial.embed %table, %token colours [1, 2] out [0, 15, 1, 0, 4, 16] : (tensor<256x64xf16>, tensor<1xi64>) -> tensor<1x64xf32>
// CHECK-NEXT: spatial.send %hidden to "layer_0" colours [0] : tensor<1x64xf32>
// CHECK-LABEL: spatial.region @layer_0 on @wse2 origin [4, 0] size [8, 20] cut "decode_layer layer=0 ctx=64" identity "LOGOS program: decode step's layer 0, ctx 64, sha256 {{[0-9a-f]+}}" weights "f16" {
// CHECK-NEXT: %x = spatial.receive "hidden" from "embedding" colours [0] out [1, 18, 1, 0, 4, 16] : tensor<1x64xf32>
// CHECK-NEXT: %attention_norm = spatial.place "model.layers.0.input_layernorm.weight" shape [1, 64] at [1, 18, 4, 1] tile [1, 16] : tensor<1x64xf16>
// CHECK-NEXT: %normed = spatial.norm %x, %attention_norm epsilon 1.000000e-05 : f64 colours [1] out [1, 18, 1, 0, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf16>) -> tensor<1x64xf32>
// CHECK-NEXT: %query_weight = spatial.place "model.layers.0.self_attn.q_proj.weight" shape [64, 64] at [0, 12, 4, 4] tile [16, 16] : tensor<64x64xf16>
// CHECK-NEXT: %normed_1 = spatial.route %normed colours [2] out [0, 12, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %query = spatial.matvec %normed_1, %query_weight colours [3, 4] out [3, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<64x64xf16>) -> tensor<1x64xf32>
// CHECK-NEXT: %key_weight = spatial.place "model.layers.0.self_attn.k_proj.weight" shape [32, 64] at [0, 16, 4, 2] tile [16, 16] : tensor<32x64xf16>
// CHECK-NEXT: %normed_2 = spatial.route %normed colours [5] out [0, 16, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %key = spatial.matvec %normed_2, %key_weight colours [6, 7] out [3, 16, 0, 1, 2, 16] : (tensor<1x64xf32>, tensor<32x64xf16>) -> tensor<1x32xf32>
// CHECK-NEXT: %value_weight = spatial.place "model.layers.0.self_attn.v_proj.weight" shape [32, 64] at [4, 16, 4, 2] tile [16, 16] : tensor<32x64xf16>
// CHECK-NEXT: %normed_3 = spatial.route %normed colours [8] out [4, 16, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %value = spatial.matvec %normed_3, %value_weight colours [9, 10] out [7, 16, 0, 1, 2, 16] : (tensor<1x64xf32>, tensor<32x64xf16>) -> tensor<1x32xf32>
// CHECK-NEXT: %query_1 = spatial.route %query colours [11] out [0, 18, 0, 1, 2, 32] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %position = spatial.receive "position" from "host" colours [0] out [0, 18, 1, 0, 1, 1] : tensor<1xi64>
// CHECK-NEXT: %turned_query = spatial.rope %query_1, %position head_dim 16 theta 1.000000e+04 : f64 colours [12] out [0, 18, 0, 1, 2, 32] : (tensor<1x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
// CHECK-NEXT: %key_1 = spatial.route %key colours [13] out [0, 18, 0, 1, 2, 16] : (tensor<1x32xf32>) -> tensor<1x32xf32>
// CHECK-NEXT: %turned_key = spatial.rope %key_1, %position head_dim 16 theta 1.000000e+04 : f64 colours [14] out [0, 18, 0, 1, 2, 16] : (tensor<1x32xf32>, tensor<1xi64>) -> tensor<1x32xf32>
// CHECK-NEXT: %keys = spatial.cache "key" layer 0 shape [2, 64, 16] at [0, 18, 1, 2] block 64 : memref<2x64x16xf16>
// CHECK-NEXT: %values = spatial.cache "value" layer 0 shape [2, 64, 16] at [0, 18, 1, 2] block 64 : memref<2x64x16xf16>
// CHECK-NEXT: spatial.cache_write %turned_key, %keys, %position colours [15] : tensor<1x32xf32>, memref<2x64x16xf16>, tensor<1xi64>
// CHECK-NEXT: %value_1 = spatial.route %value colours [16] out [0, 18, 0, 1, 2, 16] : (tensor<1x32xf32>) -> tensor<1x32xf32>
// CHECK-NEXT: spatial.cache_write %value_1, %values, %position colours [17] : tensor<1x32xf32>, memref<2x64x16xf16>, tensor<1xi64>
// CHECK-NEXT: %attended = spatial.attend %turned_query, %keys, %values, %position colours [18, 19] out [0, 18, 0, 1, 2, 32] : (tensor<1x64xf32>, memref<2x64x16xf16>, memref<2x64x16xf16>, tensor<1xi64>) -> tensor<1x64xf32>
// CHECK-NEXT: %output_weight = spatial.place "model.layers.0.self_attn.o_proj.weight" shape [64, 64] at [4, 12, 4, 4] tile [16, 16] : tensor<64x64xf16>
// CHECK-NEXT: %attended_1 = spatial.route %attended colours [20] out [4, 12, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %projected = spatial.matvec %attended_1, %output_weight colours [21, 22] out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<64x64xf16>) -> tensor<1x64xf32>
// CHECK-NEXT: %x_1 = spatial.route %x colours [23] out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %mixed = spatial.map "add" %x_1, %projected out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %mlp_norm = spatial.place "model.layers.0.post_attention_layernorm.weight" shape [1, 64] at [7, 12, 1, 4] tile [1, 16] : tensor<1x64xf16>
// CHECK-NEXT: %normed_mixed = spatial.norm %mixed, %mlp_norm epsilon 1.000000e-05 : f64 colours [1] out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf16>) -> tensor<1x64xf32>
// CHECK-NEXT: %gate_weight = spatial.place "model.layers.0.mlp.gate_proj.weight" shape [128, 64] at [0, 0, 4, 8] tile [16, 16] : tensor<128x64xf16>
// CHECK-NEXT: %normed_mixed_1 = spatial.route %normed_mixed colours [2] out [0, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %gate = spatial.matvec %normed_mixed_1, %gate_weight colours [3, 4] out [3, 0, 0, 1, 8, 16] : (tensor<1x64xf32>, tensor<128x64xf16>) -> tensor<1x128xf32>
// CHECK-NEXT: %up_weight = spatial.place "model.layers.0.mlp.up_proj.weight" shape [128, 64] at [4, 0, 4, 8] tile [16, 16] : tensor<128x64xf16>
// CHECK-NEXT: %normed_mixed_2 = spatial.route %normed_mixed colours [5] out [4, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %up = spatial.matvec %normed_mixed_2, %up_weight colours [6, 7] out [7, 0, 0, 1, 8, 16] : (tensor<1x64xf32>, tensor<128x64xf16>) -> tensor<1x128xf32>
// CHECK-NEXT: %activated = spatial.map "silu" %gate out [3, 0, 0, 1, 8, 16] : (tensor<1x128xf32>) -> tensor<1x128xf32>
// CHECK-NEXT: %activated_1 = spatial.route %activated colours [8] out [7, 0, 0, 1, 8, 16] : (tensor<1x128xf32>) -> tensor<1x128xf32>
// CHECK-NEXT: %product = spatial.map "mul" %activated_1, %up out [7, 0, 0, 1, 8, 16] : (tensor<1x128xf32>, tensor<1x128xf32>) -> tensor<1x128xf32>
// CHECK-NEXT: %down_weight = spatial.place "model.layers.0.mlp.down_proj.weight" shape [64, 128] at [0, 8, 8, 4] tile [16, 16] : tensor<64x128xf16>
// CHECK-NEXT: %product_1 = spatial.route %product colours [9] out [0, 8, 1, 0, 8, 16] : (tensor<1x128xf32>) -> tensor<1x128xf32>
// CHECK-NEXT: %down = spatial.matvec %product_1, %down_weight colours [10, 11] out [7, 8, 0, 1, 4, 16] : (tensor<1x128xf32>, tensor<64x128xf16>) -> tensor<1x64xf32>
// CHECK-NEXT: %mixed_1 = spatial.route %mixed colours [12] out [7, 8, 0, 1, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %result = spatial.map "add" %mixed_1, %down out [7, 8, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: spatial.send %result to "layer_1" colours [0] : tensor<1x64xf32>
// CHECK-LABEL: spatial.region @head on @wse2 origin [17, 0] size [4, 17] cut "decode_head" identity "LOGOS program: decode step's head, sha256 {{[0-9a-f]+}}" weights "f16" {
// CHECK-NEXT: %x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 16, 1, 0, 4, 16] : tensor<1x64xf32>
// CHECK-NEXT: %final_norm = spatial.place "model.norm.weight" shape [1, 64] at [0, 16, 4, 1] tile [1, 16] : tensor<1x64xf16>
// CHECK-NEXT: %normed = spatial.norm %x, %final_norm epsilon 1.000000e-05 : f64 colours [1] out [0, 16, 1, 0, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf16>) -> tensor<1x64xf32>
// CHECK-NEXT: %head_table = spatial.place "lm_head.weight" shape [256, 64] at [0, 0, 4, 16] tile [16, 16] : tensor<256x64xf16>
// CHECK-NEXT: %normed_1 = spatial.route %normed colours [2] out [0, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// CHECK-NEXT: %logits = spatial.matvec %normed_1, %head_table colours [3, 4] out [3, 0, 0, 1, 16, 16] : (tensor<1x64xf32>, tensor<256x64xf16>) -> tensor<1x256xf32>
// CHECK-NEXT: %next = spatial.argmax %logits colours [5] out [3, 15, 0, 1, 1, 1] : (tensor<1x256xf32>) -> tensor<1xi64>
// CHECK-NEXT: spatial.send %next to "host" colours [0] : tensor<1xi64>

builtin.module {
  spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
  spatial.region @embedding on @wse2 origin [0, 0] size [4, 16] cut "decode_embed" identity "LOGOS program: decode step's embedding, sha256 29431d19fcf918f7e2627a99a5e8d744fa36c1e5c094677eafaa0dfa1c968951" weights "f16" {
    %table = spatial.place "model.embed_tokens.weight" shape [256, 64] at [0, 0, 4, 16] tile [16, 16] : tensor<256x64xf16>
    %token = spatial.receive "token" from "host" colours [0] out [0, 0, 1, 0, 1, 1] : tensor<1xi64>
    %hidden = spatial.embed %table, %token colours [1, 2] out [0, 15, 1, 0, 4, 16] : (tensor<256x64xf16>, tensor<1xi64>) -> tensor<1x64xf32>
    spatial.send %hidden to "layer_0" colours [0] : tensor<1x64xf32>
  }
  spatial.region @layer_0 on @wse2 origin [4, 0] size [8, 20] cut "decode_layer layer=0 ctx=64" identity "LOGOS program: decode step's layer 0, ctx 64, sha256 a5a3ec536193a8c100ebb57347dff2947f506d0ab32caff21b4faf4e390b89a1" weights "f16" {
    %x = spatial.receive "hidden" from "embedding" colours [0] out [1, 18, 1, 0, 4, 16] : tensor<1x64xf32>
    %attention_norm = spatial.place "model.layers.0.input_layernorm.weight" shape [1, 64] at [1, 18, 4, 1] tile [1, 16] : tensor<1x64xf16>
    %normed = spatial.norm %x, %attention_norm epsilon 1.000000e-05 : f64 colours [1] out [1, 18, 1, 0, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf16>) -> tensor<1x64xf32>
    %query_weight = spatial.place "model.layers.0.self_attn.q_proj.weight" shape [64, 64] at [0, 12, 4, 4] tile [16, 16] : tensor<64x64xf16>
    %normed_1 = spatial.route %normed colours [2] out [0, 12, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %query = spatial.matvec %normed_1, %query_weight colours [3, 4] out [3, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<64x64xf16>) -> tensor<1x64xf32>
    %key_weight = spatial.place "model.layers.0.self_attn.k_proj.weight" shape [32, 64] at [0, 16, 4, 2] tile [16, 16] : tensor<32x64xf16>
    %normed_2 = spatial.route %normed colours [5] out [0, 16, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %key = spatial.matvec %normed_2, %key_weight colours [6, 7] out [3, 16, 0, 1, 2, 16] : (tensor<1x64xf32>, tensor<32x64xf16>) -> tensor<1x32xf32>
    %value_weight = spatial.place "model.layers.0.self_attn.v_proj.weight" shape [32, 64] at [4, 16, 4, 2] tile [16, 16] : tensor<32x64xf16>
    %normed_3 = spatial.route %normed colours [8] out [4, 16, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %value = spatial.matvec %normed_3, %value_weight colours [9, 10] out [7, 16, 0, 1, 2, 16] : (tensor<1x64xf32>, tensor<32x64xf16>) -> tensor<1x32xf32>
    %query_1 = spatial.route %query colours [11] out [0, 18, 0, 1, 2, 32] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %position = spatial.receive "position" from "host" colours [0] out [0, 18, 1, 0, 1, 1] : tensor<1xi64>
    %turned_query = spatial.rope %query_1, %position head_dim 16 theta 1.000000e+04 : f64 colours [12] out [0, 18, 0, 1, 2, 32] : (tensor<1x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
    %key_1 = spatial.route %key colours [13] out [0, 18, 0, 1, 2, 16] : (tensor<1x32xf32>) -> tensor<1x32xf32>
    %turned_key = spatial.rope %key_1, %position head_dim 16 theta 1.000000e+04 : f64 colours [14] out [0, 18, 0, 1, 2, 16] : (tensor<1x32xf32>, tensor<1xi64>) -> tensor<1x32xf32>
    %keys = spatial.cache "key" layer 0 shape [2, 64, 16] at [0, 18, 1, 2] block 64 : memref<2x64x16xf16>
    %values = spatial.cache "value" layer 0 shape [2, 64, 16] at [0, 18, 1, 2] block 64 : memref<2x64x16xf16>
    spatial.cache_write %turned_key, %keys, %position colours [15] : tensor<1x32xf32>, memref<2x64x16xf16>, tensor<1xi64>
    %value_1 = spatial.route %value colours [16] out [0, 18, 0, 1, 2, 16] : (tensor<1x32xf32>) -> tensor<1x32xf32>
    spatial.cache_write %value_1, %values, %position colours [17] : tensor<1x32xf32>, memref<2x64x16xf16>, tensor<1xi64>
    %attended = spatial.attend %turned_query, %keys, %values, %position colours [18, 19] out [0, 18, 0, 1, 2, 32] : (tensor<1x64xf32>, memref<2x64x16xf16>, memref<2x64x16xf16>, tensor<1xi64>) -> tensor<1x64xf32>
    %output_weight = spatial.place "model.layers.0.self_attn.o_proj.weight" shape [64, 64] at [4, 12, 4, 4] tile [16, 16] : tensor<64x64xf16>
    %attended_1 = spatial.route %attended colours [20] out [4, 12, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %projected = spatial.matvec %attended_1, %output_weight colours [21, 22] out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<64x64xf16>) -> tensor<1x64xf32>
    %x_1 = spatial.route %x colours [23] out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %mixed = spatial.map "add" %x_1, %projected out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf32>) -> tensor<1x64xf32>
    %mlp_norm = spatial.place "model.layers.0.post_attention_layernorm.weight" shape [1, 64] at [7, 12, 1, 4] tile [1, 16] : tensor<1x64xf16>
    %normed_mixed = spatial.norm %mixed, %mlp_norm epsilon 1.000000e-05 : f64 colours [1] out [7, 12, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf16>) -> tensor<1x64xf32>
    %gate_weight = spatial.place "model.layers.0.mlp.gate_proj.weight" shape [128, 64] at [0, 0, 4, 8] tile [16, 16] : tensor<128x64xf16>
    %normed_mixed_1 = spatial.route %normed_mixed colours [2] out [0, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %gate = spatial.matvec %normed_mixed_1, %gate_weight colours [3, 4] out [3, 0, 0, 1, 8, 16] : (tensor<1x64xf32>, tensor<128x64xf16>) -> tensor<1x128xf32>
    %up_weight = spatial.place "model.layers.0.mlp.up_proj.weight" shape [128, 64] at [4, 0, 4, 8] tile [16, 16] : tensor<128x64xf16>
    %normed_mixed_2 = spatial.route %normed_mixed colours [5] out [4, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %up = spatial.matvec %normed_mixed_2, %up_weight colours [6, 7] out [7, 0, 0, 1, 8, 16] : (tensor<1x64xf32>, tensor<128x64xf16>) -> tensor<1x128xf32>
    %activated = spatial.map "silu" %gate out [3, 0, 0, 1, 8, 16] : (tensor<1x128xf32>) -> tensor<1x128xf32>
    %activated_1 = spatial.route %activated colours [8] out [7, 0, 0, 1, 8, 16] : (tensor<1x128xf32>) -> tensor<1x128xf32>
    %product = spatial.map "mul" %activated_1, %up out [7, 0, 0, 1, 8, 16] : (tensor<1x128xf32>, tensor<1x128xf32>) -> tensor<1x128xf32>
    %down_weight = spatial.place "model.layers.0.mlp.down_proj.weight" shape [64, 128] at [0, 8, 8, 4] tile [16, 16] : tensor<64x128xf16>
    %product_1 = spatial.route %product colours [9] out [0, 8, 1, 0, 8, 16] : (tensor<1x128xf32>) -> tensor<1x128xf32>
    %down = spatial.matvec %product_1, %down_weight colours [10, 11] out [7, 8, 0, 1, 4, 16] : (tensor<1x128xf32>, tensor<64x128xf16>) -> tensor<1x64xf32>
    %mixed_1 = spatial.route %mixed colours [12] out [7, 8, 0, 1, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %result = spatial.map "add" %mixed_1, %down out [7, 8, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf32>) -> tensor<1x64xf32>
    spatial.send %result to "layer_1" colours [0] : tensor<1x64xf32>
  }
  spatial.region @head on @wse2 origin [17, 0] size [4, 17] cut "decode_head" identity "LOGOS program: decode step's head, sha256 3037505dbf0cf1ff346db97f1ed50fba867b4ef75e5d2dd2aaeae94988609b36" weights "f16" {
    %x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 16, 1, 0, 4, 16] : tensor<1x64xf32>
    %final_norm = spatial.place "model.norm.weight" shape [1, 64] at [0, 16, 4, 1] tile [1, 16] : tensor<1x64xf16>
    %normed = spatial.norm %x, %final_norm epsilon 1.000000e-05 : f64 colours [1] out [0, 16, 1, 0, 4, 16] : (tensor<1x64xf32>, tensor<1x64xf16>) -> tensor<1x64xf32>
    %head_table = spatial.place "lm_head.weight" shape [256, 64] at [0, 0, 4, 16] tile [16, 16] : tensor<256x64xf16>
    %normed_1 = spatial.route %normed colours [2] out [0, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
    %logits = spatial.matvec %normed_1, %head_table colours [3, 4] out [3, 0, 0, 1, 16, 16] : (tensor<1x64xf32>, tensor<256x64xf16>) -> tensor<1x256xf32>
    %next = spatial.argmax %logits colours [5] out [3, 15, 0, 1, 1, 1] : (tensor<1x256xf32>) -> tensor<1xi64>
    spatial.send %next to "host" colours [0] : tensor<1xi64>
  }
}

