// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// A region stored in a block format (docs/d5005.md, "Weights as stored"): printed and parsed back with its
// format, and refused where the verifier says so.

// CHECK: d5005.embed_row %x, <"model.embed_tokens.weight" at 0 stride 128 rows 256 cols 64 bytes 1 stored q8_0>
// CHECK: d5005.matvec %q, %n, <"q_proj" at 8192 stride 128 rows 64 cols 64 bytes 1 stored q4_1>
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %x = d5005.buffer "x" words 64 at 0 in "residual"
  %n = d5005.buffer "n" words 64 at 0 in "inputs"
  %q = d5005.buffer "q" words 64 at 0 in "outputs"
  d5005.embed_row %x, <"model.embed_tokens.weight" at 0 stride 128 rows 256 cols 64 bytes 1 stored q8_0>
  d5005.matvec %q, %n, <"q_proj" at 8192 stride 128 rows 64 cols 64 bytes 1 stored q4_1>
}
// -----
// CHECK: region 'w': stored in 'q5_0', not a format the engine reads (q8_0, q4_0, q4_1)
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 64 cols 64 bytes 1 stored q5_0>
}
// -----
// CHECK: region 'w': q4_0 rows are whole blocks of 32 in bytes (bytes 1)
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 48 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 64 cols 48 bytes 1 stored q4_0>
}
// -----
// CHECK: region 'w': a q8_0 row of 64 numbers takes 68 bytes, over its stride of 64
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 64 rows 64 cols 64 bytes 1 stored q8_0>
}
