// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// One verifier diagnostic per case: each names the op and what is wrong.

// CHECK: 'logos.input' op has unknown input kind 'tokenz' (expected one of token, position, hidden)
%t = logos.input "tokenz" values [1] : tensor<1xi64>
// -----
// CHECK: 'logos.input' op number of values mismatch: got 2, expected 1
%t = logos.input "token" values [1, 2] : tensor<1xi64>
// -----
// CHECK: 'logos.input' op tokens count from 1, got [0]
%t = logos.input "token" values [0] : tensor<1xi64>
// -----
// CHECK: 'logos.input' op expects positions of type i64, got f32
%t = logos.input "position" values [1] : tensor<1xf32>
// -----
// CHECK: 'logos.input' op a hidden-state input carries no values
%h = logos.input "hidden" values [1] : tensor<1x4xf32>
// -----
// CHECK: 'logos.weight' op shape of 'w' mismatch: got (64, 32), expected (64, 64)
%w = logos.weight "w" shape [64, 64] : tensor<64x32xf32>
// -----
// CHECK: 'logos.weight' op of 'w' has an invalid shape [64, 0]
%w = logos.weight "w" shape [64, 0] : tensor<64x0xf32>
// -----
// CHECK: 'logos.weight' op rows (64) do not divide over 3 chips
shard.grid @chips(shape = 3)
%w = logos.weight "w" shape [64, 64] split "rows" over @chips : tensor<21x64xf32>
// -----
// CHECK: 'logos.weight' op cannot be split by diagonal (expected one of rows, columns)
shard.grid @chips(shape = 2)
%w = logos.weight "w" shape [64, 64] split "diagonal" over @chips : tensor<32x64xf32>
// -----
// CHECK: 'logos.weight' op cannot be split by experts (expected one of rows, columns)
shard.grid @chips(shape = 2)
%w = logos.weight "w" shape [64, 64] split "experts" over @chips : tensor<32x64xf32>
// -----
// CHECK: 'logos.weight' op cannot be split by rows (expected one of experts)
shard.grid @chips(shape = 2)
%w = logos.weight "w" shape [4, 32, 64] split "rows" over @chips : tensor<2x32x64xf32>
// -----
// CHECK: 'logos.experts' op router logits shape mismatch: got (2, 2), expected (2, 4)
shard.grid @chips(shape = 2)
%x = logos.input "hidden" : tensor<2x64xf32>
%logits = logos.input "hidden" : tensor<2x2xf32>
%g = logos.weight "g" shape [4, 32, 64] split "experts" over @chips : tensor<2x32x64xf32>
%d = logos.weight "d" shape [4, 64, 32] split "experts" over @chips : tensor<2x64x32xf32>
%r = logos.experts %x, %logits, %g, %g, %d top_k 2 : (tensor<2x64xf32>, tensor<2x2xf32>, tensor<2x32x64xf32>, tensor<2x32x64xf32>, tensor<2x64x32xf32>) -> tensor<2x64xf32>
// -----
// CHECK: 'logos.experts' op has stacked weights split by experts beside weights that are not
shard.grid @chips(shape = 1)
%x = logos.input "hidden" : tensor<2x64xf32>
%logits = logos.input "hidden" : tensor<2x4xf32>
%g = logos.weight "g" shape [4, 32, 64] split "experts" over @chips : tensor<4x32x64xf32>
%u = logos.weight "u" shape [4, 32, 64] : tensor<4x32x64xf32>
%d = logos.weight "d" shape [4, 64, 32] split "experts" over @chips : tensor<4x64x32xf32>
%r = logos.experts %x, %logits, %g, %u, %d top_k 2 : (tensor<2x64xf32>, tensor<2x4xf32>, tensor<4x32x64xf32>, tensor<4x32x64xf32>, tensor<4x64x32xf32>) -> tensor<2x64xf32>
// -----
// CHECK: 'logos.weight' op refers to @nowhere, which is not a shard.grid
%w = logos.weight "w" shape [64, 64] split "rows" over @nowhere : tensor<32x64xf32>
// -----
// CHECK: 'logos.cache' op has unknown cache kind 'query' (expected key or value)
%c = logos.cache "query" layer 0 shape [2, 64, 16] : memref<2x64x16xf32>
// -----
// CHECK: 'logos.cache' op expects a shape [sequences,] heads, positions, head size; got [64, 16]
%c = logos.cache "key" layer 0 shape [64, 16] : memref<64x16xf32>
// -----
// CHECK: 'logos.embed' op result shape mismatch: got (2, 64), expected (1, 64)
%t = logos.input "token" values [1] : tensor<1xi64>
%w = logos.weight "w" shape [256, 64] : tensor<256x64xf32>
%x = logos.embed %w, %t : (tensor<256x64xf32>, tensor<1xi64>) -> tensor<2x64xf32>
// -----
// CHECK: 'logos.rms_norm' op weight shape mismatch: got (32,), expected (64,)
%x = logos.input "hidden" : tensor<1x64xf32>
%w = logos.weight "n" shape [32] : tensor<32xf32>
%n = logos.rms_norm %x, %w epsilon 1.000000e-05 : f64 : (tensor<1x64xf32>, tensor<32xf32>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.linear' op cannot apply a 32 by 16 weight to rows of 64
%x = logos.input "hidden" : tensor<1x64xf32>
%w = logos.weight "w" shape [32, 16] : tensor<32x16xf32>
%y = logos.linear %x, %w : (tensor<1x64xf32>, tensor<32x16xf32>) -> tensor<1x32xf32>
// -----
// CHECK: 'logos.rope' op number of positions mismatch: got (2,), expected (1,)
%x = logos.input "hidden" : tensor<1x64xf32>
%p = logos.input "position" values [1, 2] : tensor<2xi64>
%y = logos.rope %x, %p head_dim 16 theta 1.000000e+04 : f64 : (tensor<1x64xf32>, tensor<2xi64>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.rope' op cannot rotate rows of 64 in heads of 15
%x = logos.input "hidden" : tensor<1x64xf32>
%p = logos.input "position" values [1] : tensor<1xi64>
%y = logos.rope %x, %p head_dim 15 theta 1.000000e+04 : f64 : (tensor<1x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.rope' op cannot rotate 16 numbers of each head of 16
%x = logos.input "hidden" : tensor<1x64xf32>
%p = logos.input "position" values [1] : tensor<1xi64>
%y = logos.rope %x, %p head_dim 16 rotary_dim 16 theta 1.000000e+04 : f64 : (tensor<1x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.rope' op scales its frequencies twice: Llama 3's scaling and a linear one
%x = logos.input "hidden" : tensor<1x64xf32>
%p = logos.input "position" values [1] : tensor<1xi64>
%y = logos.rope %x, %p head_dim 16 theta 1.000000e+04 : f64 scaling <factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192> linear_scaling <factor = 2.0> : (tensor<1x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.attention' op 3 query heads do not share 2 key-value heads evenly
%q = logos.input "hidden" : tensor<1x48xf32>
%p = logos.input "position" values [1] : tensor<1xi64>
%c = logos.cache "key" layer 0 shape [2, 8, 16] : memref<2x8x16xf32>
%a = logos.attention %q, %c, %c, %p : (tensor<1x48xf32>, memref<2x8x16xf32>, memref<2x8x16xf32>, tensor<1xi64>) -> tensor<1x48xf32>
// -----
// CHECK: 'logos.cache_write' op row width mismatch: got 32, expected 16
%x = logos.input "hidden" : tensor<1x32xf32>
%p = logos.input "position" values [1] : tensor<1xi64>
%c = logos.cache "key" layer 0 shape [2, 8, 8] : memref<2x8x8xf32>
logos.cache_write %x, %c, %p : tensor<1x32xf32>, memref<2x8x8xf32>, tensor<1xi64>
// -----
// CHECK: operand 'rhs' at position 1 does not verify:
%x = logos.input "hidden" : tensor<1x64xf32>
%y = logos.input "hidden" : tensor<1x32xf32>
%z = "logos.add"(%x, %y) : (tensor<1x64xf32>, tensor<1x32xf32>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.row' op row 3 does not exist in 2 rows (rows count from 1)
%x = logos.input "hidden" : tensor<2x64xf32>
%r = logos.row %x index 3 : (tensor<2x64xf32>) -> tensor<1x64xf32>
// -----
// CHECK: 'logos.argmax' op result shape mismatch: got (1,), expected (2,)
%x = logos.input "hidden" : tensor<2x64xf32>
%r = logos.argmax %x : (tensor<2x64xf32>) -> tensor<1xi64>
// -----
// CHECK: 'logos.program' op expects a digest of 64 lowercase hex digits, got 'abc'
logos.program cut "decode ctx=64" chips 1 digest "abc" model <vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 128, rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false> {
  builtin.module {
    func.func @main() {
      func.return
    }
  }
}
// -----
// CHECK: 'logos.program' op has a model attribute that is not a valid spec: heads (3) must be a multiple of kv_heads (2) for grouped-query attention
logos.program cut "decode ctx=64" chips 1 digest "0000000000000000000000000000000000000000000000000000000000000000" model <vocab = 256, hidden = 64, layers = 2, heads = 3, kv_heads = 2, head_dim = 16, intermediate = 128, rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false> {
  builtin.module {
    func.func @main() {
      func.return
    }
  }
}
// -----
// CHECK: 'logos.program' op has no @main section
logos.program cut "decode ctx=64" chips 1 digest "0000000000000000000000000000000000000000000000000000000000000000" model <vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 128, rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false> {
  builtin.module {
    func.func @other() {
      func.return
    }
  }
}
// -----
// CHECK: 'logos.program' op expects its body to hold one builtin.module, the program's sections and chip grid
logos.program cut "decode ctx=64" chips 1 digest "0000000000000000000000000000000000000000000000000000000000000000" model <vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 128, rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false> {
  func.func @main() {
    func.return
  }
}
