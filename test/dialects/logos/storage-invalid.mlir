// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s
// RUN: not %logos-opt %S/storage-unknown.mlir 2>&1 | %filecheck --check-prefix=UNKNOWN %s

// A weight's storage holds its rows in whole blocks, and a split by columns leaves each chip whole blocks.

// CHECK: 'logos.weight' op of 'w': rows of 48 are not whole q4_1 blocks of 32
%w = logos.weight "w" shape [64, 48] stored <q4_1> : tensor<64x48xf32>
// -----
// CHECK: 'logos.weight' op of 'w': rows of 128 are not whole q4_k blocks of 256
%w = logos.weight "w" shape [64, 128] stored <q4_k> : tensor<64x128xf32>
// -----
// CHECK: 'logos.weight' op of 'w' splits its q6_k blocks of 256: a chip's 128 columns are not whole blocks
shard.grid @chips(shape = 2)
%w = logos.weight "w" shape [64, 256] split "columns" over @chips stored <q6_k> : tensor<64x128xf32>

// UNKNOWN:      storage-unknown.mlir:3:46: error: unknown storage format 'q4_2' (expected one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, mxfp4, fp8)
