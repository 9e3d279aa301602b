// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// Each storage format a weight can carry, printed and parsed back.

builtin.module {
  shard.grid @chips(shape = 2)
  %a_f32x = logos.weight "a" shape [4, 256] stored <f32> : tensor<4x256xf32>
  %b_f16x = logos.weight "b" shape [4, 256] stored <f16> : tensor<4x256xf32>
  %c_bf16x = logos.weight "c" shape [4, 256] stored <bf16> : tensor<4x256xf32>
  %d_q80x = logos.weight "d" shape [4, 256] stored <q8_0> : tensor<4x256xf32>
  %e_q40x = logos.weight "e" shape [4, 256] stored <q4_0> : tensor<4x256xf32>
  %f_q41x = logos.weight "f" shape [4, 256] stored <q4_1> : tensor<4x256xf32>
  %g_q50x = logos.weight "g" shape [4, 256] stored <q5_0> : tensor<4x256xf32>
  %h_q51x = logos.weight "h" shape [4, 256] stored <q5_1> : tensor<4x256xf32>
  %i_q2kx = logos.weight "i" shape [4, 256] stored <q2_k> : tensor<4x256xf32>
  %j_q3kx = logos.weight "j" shape [4, 256] stored <q3_k> : tensor<4x256xf32>
  %k_q4kx = logos.weight "k" shape [4, 256] stored <q4_k> : tensor<4x256xf32>
  %l_q5kx = logos.weight "l" shape [4, 256] stored <q5_k> : tensor<4x256xf32>
  %m_q6kx = logos.weight "m" shape [4, 256] stored <q6_k> : tensor<4x256xf32>
  %n_mxfp4x = logos.weight "n" shape [4, 256] stored <mxfp4> : tensor<4x256xf32>
  %o_rowsx = logos.weight "o" shape [4, 512] split "rows" over @chips stored <q4_k> : tensor<2x512xf32>
  %p_columnsx = logos.weight "p" shape [4, 512] split "columns" over @chips stored <q4_k> : tensor<4x256xf32>
}

// CHECK:      %a_f32x = logos.weight "a" shape [4, 256] stored <f32> : tensor<4x256xf32>
// CHECK-NEXT: %b_f16x = logos.weight "b" shape [4, 256] stored <f16> : tensor<4x256xf32>
// CHECK-NEXT: %c_bf16x = logos.weight "c" shape [4, 256] stored <bf16> : tensor<4x256xf32>
// CHECK-NEXT: %d_q80x = logos.weight "d" shape [4, 256] stored <q8_0> : tensor<4x256xf32>
// CHECK-NEXT: %e_q40x = logos.weight "e" shape [4, 256] stored <q4_0> : tensor<4x256xf32>
// CHECK-NEXT: %f_q41x = logos.weight "f" shape [4, 256] stored <q4_1> : tensor<4x256xf32>
// CHECK-NEXT: %g_q50x = logos.weight "g" shape [4, 256] stored <q5_0> : tensor<4x256xf32>
// CHECK-NEXT: %h_q51x = logos.weight "h" shape [4, 256] stored <q5_1> : tensor<4x256xf32>
// CHECK-NEXT: %i_q2kx = logos.weight "i" shape [4, 256] stored <q2_k> : tensor<4x256xf32>
// CHECK-NEXT: %j_q3kx = logos.weight "j" shape [4, 256] stored <q3_k> : tensor<4x256xf32>
// CHECK-NEXT: %k_q4kx = logos.weight "k" shape [4, 256] stored <q4_k> : tensor<4x256xf32>
// CHECK-NEXT: %l_q5kx = logos.weight "l" shape [4, 256] stored <q5_k> : tensor<4x256xf32>
// CHECK-NEXT: %m_q6kx = logos.weight "m" shape [4, 256] stored <q6_k> : tensor<4x256xf32>
// CHECK-NEXT: %n_mxfp4x = logos.weight "n" shape [4, 256] stored <mxfp4> : tensor<4x256xf32>
// CHECK-NEXT: %o_rowsx = logos.weight "o" shape [4, 512] split "rows" over @chips stored <q4_k> : tensor<2x512xf32>
// CHECK-NEXT: %p_columnsx = logos.weight "p" shape [4, 512] split "columns" over @chips stored <q4_k> : tensor<4x256xf32>
