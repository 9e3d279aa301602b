// convert-logos-to-d5005 on tiny's decode step: one instruction per logos op (SiLU and the product that reads
// it select one, silu_mul), the sections @main calls inlined in order (inline-sections), weights and caches as regions striped over the four banks, the
// on-chip buffers named after the values they hold and shared by both layers; the identity line carried over.
// RUN: %logos-author --model tiny --cut 'decode ctx=64' | %logos-opt -f logos -p 'inline-sections,convert-logos-to-d5005{weights=bf16}' | filecheck %s
// RUN: %logos-author --model tiny --cut 'decode ctx=64' | %logos-opt -f logos -p 'logos-to-d5005{weights=f32}' | filecheck %s --check-prefix=F32
// RUN: %logos-author --model smollm2-135m --cut 'decode ctx=128' | %logos-opt -f logos -p 'logos-to-d5005' | filecheck %s --check-prefix=TIED

// CHECK-LABEL: d5005.program identity "LOGOS program: decode step, ctx 64, sha256 {{[0-9a-f]+}}" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 1048576 {
// CHECK-NEXT:     %hidden = d5005.buffer "hidden" words 64 at 0 in "residual"
// CHECK-NEXT:     %normed = d5005.buffer "normed" words 64 at 0 in "inputs"
// CHECK-NEXT:     %query = d5005.buffer "query" words 64 at 0 in "outputs"
// CHECK-NEXT:     %key = d5005.buffer "key" words 32 at 64 in "outputs"
// CHECK-NEXT:     %value = d5005.buffer "value" words 32 at 96 in "outputs"
// CHECK-NEXT:     %turned_query = d5005.buffer "turned_query" words 64 at 0 in "rotated"
// CHECK-NEXT:     %turned_key = d5005.buffer "turned_key" words 32 at 64 in "rotated"
// CHECK-NEXT:     %attended = d5005.buffer "attended" words 64 at 0 in "attended"
// CHECK-NEXT:     %projected = d5005.buffer "projected" words 64 at 128 in "outputs"
// CHECK-NEXT:     %mixed = d5005.buffer "mixed" words 64 at 64 in "residual"
// CHECK-NEXT:     %normed_mixed = d5005.buffer "normed_mixed" words 64 at 64 in "inputs"
// CHECK-NEXT:     %gate = d5005.buffer "gate" words 128 at 192 in "outputs"
// CHECK-NEXT:     %up = d5005.buffer "up" words 128 at 320 in "outputs"
// CHECK-NEXT:     %product = d5005.buffer "product" words 128 at 128 in "inputs"
// CHECK-NEXT:     %down = d5005.buffer "down" words 64 at 448 in "outputs"
// CHECK-NEXT:     %result = d5005.buffer "result" words 64 at 128 in "residual"
// CHECK-NEXT:     %logits = d5005.buffer "logits" words 256 at 512 in "outputs"
// CHECK-NEXT:     d5005.embed_row %hidden, <"model.embed_tokens.weight" at 0 stride 128 rows 256 cols 64 bytes 2>
// CHECK-NEXT:     d5005.rms_norm %normed, %hidden, <"model.layers.0.input_layernorm.weight" at 8192 stride 128 rows 1 cols 64 bytes 2> epsilon 1.000000e-05 : f32
// CHECK-NEXT:     d5005.matvec %query, %normed, <"model.layers.0.self_attn.q_proj.weight" at 8320 stride 128 rows 64 cols 64 bytes 2>
// CHECK-NEXT:     d5005.matvec %key, %normed, <"model.layers.0.self_attn.k_proj.weight" at 10368 stride 128 rows 32 cols 64 bytes 2>
// CHECK-NEXT:     d5005.matvec %value, %normed, <"model.layers.0.self_attn.v_proj.weight" at 11392 stride 128 rows 32 cols 64 bytes 2>
// CHECK-NEXT:     d5005.rope %turned_query, %query, <"rope" at 53888 stride 128 rows 64 cols 32 bytes 4> width 64 head_dim 16
// CHECK-NEXT:     d5005.rope %turned_key, %key, <"rope" at 53888 stride 128 rows 64 cols 32 bytes 4> width 32 head_dim 16
// CHECK-NEXT:     d5005.cache_write %turned_key, <"cache.0.key" at 55936 stride 64 rows 128 cols 16 bytes 2> kv_heads 2
// CHECK-NEXT:     d5005.cache_write %value, <"cache.0.value" at 57984 stride 64 rows 128 cols 16 bytes 2> kv_heads 2
// CHECK-NEXT:     d5005.attention %attended, %turned_query, <"cache.0.key" at 55936 stride 64 rows 128 cols 16 bytes 2>, <"cache.0.value" at 57984 stride 64 rows 128 cols 16 bytes 2> current %turned_key, %value heads 4 kv_heads 2
// CHECK-NEXT:     d5005.matvec %projected, %attended, <"model.layers.0.self_attn.o_proj.weight" at 12416 stride 128 rows 64 cols 64 bytes 2>
// CHECK-NEXT:     d5005.add %mixed, %hidden, %projected size 64
// CHECK-NEXT:     d5005.rms_norm %normed_mixed, %mixed, <"model.layers.0.post_attention_layernorm.weight" at 14464 stride 128 rows 1 cols 64 bytes 2> epsilon 1.000000e-05 : f32
// CHECK-NEXT:     d5005.matvec %gate, %normed_mixed, <"model.layers.0.mlp.gate_proj.weight" at 14592 stride 128 rows 128 cols 64 bytes 2>
// CHECK-NEXT:     d5005.matvec %up, %normed_mixed, <"model.layers.0.mlp.up_proj.weight" at 18688 stride 128 rows 128 cols 64 bytes 2>
// CHECK-NEXT:     d5005.silu_mul %product, %gate, %up size 128
// CHECK-NEXT:     d5005.matvec %down, %product, <"model.layers.0.mlp.down_proj.weight" at 22784 stride 256 rows 64 cols 128 bytes 2>
// CHECK-NEXT:     d5005.add %result, %mixed, %down size 64
// CHECK-NEXT:     d5005.rms_norm %normed, %result, <"model.layers.1.input_layernorm.weight" at 26880 stride 128 rows 1 cols 64 bytes 2> epsilon 1.000000e-05 : f32
// CHECK-NEXT:     d5005.matvec %query, %normed, <"model.layers.1.self_attn.q_proj.weight" at 27008 stride 128 rows 64 cols 64 bytes 2>
// CHECK-NEXT:     d5005.matvec %key, %normed, <"model.layers.1.self_attn.k_proj.weight" at 29056 stride 128 rows 32 cols 64 bytes 2>
// CHECK-NEXT:     d5005.matvec %value, %normed, <"model.layers.1.self_attn.v_proj.weight" at 30080 stride 128 rows 32 cols 64 bytes 2>
// CHECK-NEXT:     d5005.rope %turned_query, %query, <"rope" at 53888 stride 128 rows 64 cols 32 bytes 4> width 64 head_dim 16
// CHECK-NEXT:     d5005.rope %turned_key, %key, <"rope" at 53888 stride 128 rows 64 cols 32 bytes 4> width 32 head_dim 16
// CHECK-NEXT:     d5005.cache_write %turned_key, <"cache.1.key" at 60032 stride 64 rows 128 cols 16 bytes 2> kv_heads 2
// CHECK-NEXT:     d5005.cache_write %value, <"cache.1.value" at 62080 stride 64 rows 128 cols 16 bytes 2> kv_heads 2
// CHECK-NEXT:     d5005.attention %attended, %turned_query, <"cache.1.key" at 60032 stride 64 rows 128 cols 16 bytes 2>, <"cache.1.value" at 62080 stride 64 rows 128 cols 16 bytes 2> current %turned_key, %value heads 4 kv_heads 2
// CHECK-NEXT:     d5005.matvec %projected, %attended, <"model.layers.1.self_attn.o_proj.weight" at 31104 stride 128 rows 64 cols 64 bytes 2>
// CHECK-NEXT:     d5005.add %mixed, %result, %projected size 64
// CHECK-NEXT:     d5005.rms_norm %normed_mixed, %mixed, <"model.layers.1.post_attention_layernorm.weight" at 33152 stride 128 rows 1 cols 64 bytes 2> epsilon 1.000000e-05 : f32
// CHECK-NEXT:     d5005.matvec %gate, %normed_mixed, <"model.layers.1.mlp.gate_proj.weight" at 33280 stride 128 rows 128 cols 64 bytes 2>
// CHECK-NEXT:     d5005.matvec %up, %normed_mixed, <"model.layers.1.mlp.up_proj.weight" at 37376 stride 128 rows 128 cols 64 bytes 2>
// CHECK-NEXT:     d5005.silu_mul %product, %gate, %up size 128
// CHECK-NEXT:     d5005.matvec %down, %product, <"model.layers.1.mlp.down_proj.weight" at 41472 stride 256 rows 64 cols 128 bytes 2>
// CHECK-NEXT:     d5005.add %result, %mixed, %down size 64
// CHECK-NEXT:     d5005.rms_norm %normed, %result, <"model.norm.weight" at 45568 stride 128 rows 1 cols 64 bytes 2> epsilon 1.000000e-05 : f32
// CHECK-NEXT:     d5005.matvec %logits, %normed, <"lm_head.weight" at 45696 stride 128 rows 256 cols 64 bytes 2>
// CHECK-NEXT:     d5005.argmax %logits size 256
// CHECK-NEXT:   }
// CHECK-NEXT: }

// f32 weights: rows of 4-byte elements, so twice the stride; the caches and the rotary table are f32 either way.
// F32-LABEL: d5005.program identity "LOGOS program: decode step, ctx 64, sha256 {{[0-9a-f]+}}" weights "f32" ctx 64 clock_mhz 300 burst 64 onchip 1048576 {
// F32: d5005.embed_row %hidden, <"model.embed_tokens.weight" at 0 stride 256 rows 256 cols 64 bytes 4>
// F32-NEXT: d5005.rms_norm %normed, %hidden, <"model.layers.0.input_layernorm.weight" at 16384 stride 256 rows 1 cols 64 bytes 4> epsilon 1.000000e-05 : f32
// F32-NEXT: d5005.matvec %query, %normed, <"model.layers.0.self_attn.q_proj.weight" at 16640 stride 256 rows 64 cols 64 bytes 4>

// A tied head streams the embedding's region (placed once, at offset 0); MQA-free SmolLM2 has 3 KV heads of 64.
// TIED: d5005.attention %attended, %turned_query, <"cache.0.key" at 67318400 stride 128 rows 384 cols 64 bytes 2>, <"cache.0.value" at 67330688 stride 128 rows 384 cols 64 bytes 2> current %turned_key, %value heads 9 kv_heads 3
// TIED: d5005.matvec %logits, %normed, <"model.embed_tokens.weight" at 0 stride 1152 rows 49152 cols 576 bytes 2>
// TIED-NEXT: d5005.argmax %logits size 49152
// TIED-NEXT: }
// TIED-NOT: lm_head
