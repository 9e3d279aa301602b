// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// One verifier diagnostic per case: each names the op (or the region) and what is wrong.

// CHECK: region 'w' ends at byte 8589934720 of its banks, past their 8589934592 bytes
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 8589934592 stride 128 rows 4 cols 64 bytes 2>
}
// -----
// CHECK: 'd5005.matvec' op region 'w': offset 100 is not a multiple of the 64-byte burst
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 100 stride 128 rows 64 cols 64 bytes 2>
}
// -----
// CHECK: 'd5005.matvec' op region 'w': stride 160 is not a multiple of the 64-byte burst
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 80 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 160 rows 64 cols 80 bytes 2>
}
// -----
// CHECK: region 'w': a row of 64 elements of 4 bytes does not fit its stride of 128 bytes
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 64 cols 64 bytes 4>
}
// -----
// CHECK: 'd5005.program' op buffer 'a' lies past the 128 words of on-chip array 'attended'
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 128 at 64 in "attended"
}
// -----
// CHECK: 'd5005.program' op buffer 'b' starts at word 4090, not on a bank word of 16
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %b = d5005.buffer "b" words 64 at 4090 in "outputs"
}
// -----
// CHECK: 'd5005.matvec' op needs 128 words of buffer 'a', which has 64
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 128 cols 64 bytes 2>
}
// -----
// CHECK: 'd5005.add' op uses a buffer that is not a d5005.buffer of its program
%c = d5005.buffer "c" words 64 at 64
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "residual"
  d5005.add %a, %a, %c size 64
}
// -----
// CHECK: 'd5005.matvec' op writes the buffer it streams: a matvec is never in place
%a = d5005.buffer "a" words 64 at 0
d5005.matvec %a, %a, <"w" at 0 stride 128 rows 64 cols 64 bytes 2>
// -----
// CHECK: 'd5005.rms_norm' op reads a weight vector, not a matrix of 2 rows
%a = d5005.buffer "a" words 64 at 0
%b = d5005.buffer "b" words 64 at 64
d5005.rms_norm %a, %b, <"w" at 0 stride 128 rows 2 cols 64 bytes 2> epsilon 1.0e-05 : f32
// -----
// CHECK: 'd5005.rope' op cannot rotate 60 words in heads of 16
%a = d5005.buffer "a" words 64 at 0
%b = d5005.buffer "b" words 64 at 64
d5005.rope %a, %b, <"rope" at 0 stride 64 rows 64 cols 16 bytes 4> width 60 head_dim 16
// -----
// CHECK: 'd5005.rope' op its table has rows of 8, not two halves of the head's 16
%a = d5005.buffer "a" words 64 at 0
%b = d5005.buffer "b" words 64 at 64
d5005.rope %a, %b, <"rope" at 0 stride 64 rows 64 cols 8 bytes 4> width 64 head_dim 16
// -----
// CHECK: 'd5005.cache_write' op cache 'k' holds 2-byte elements, not the f32 weights'
d5005.program identity "x" weights "f32" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "rotated"
  d5005.cache_write %a, <"k" at 0 stride 64 rows 128 cols 16 bytes 2> kv_heads 2
}
// -----
// CHECK: 'd5005.attention' op 9 query heads share a KV head, over the engine's 8
%o = d5005.buffer "o" words 64 at 0
%q = d5005.buffer "q" words 64 at 64
%a = d5005.buffer "a" words 64 at 128
%b = d5005.buffer "b" words 64 at 192
d5005.attention %o, %q, <"k" at 0 stride 64 rows 64 cols 16 bytes 4>, <"v" at 16384 stride 64 rows 64 cols 16 bytes 4> current %a, %b heads 9 kv_heads 1
// -----
// CHECK: 'd5005.cache_write' op cache 'k' of 100 rows is not 3 heads of positions
%a = d5005.buffer "a" words 64 at 0
d5005.cache_write %a, <"k" at 0 stride 64 rows 100 cols 16 bytes 4> kv_heads 3
// -----
// CHECK: 'd5005.attention' op 6 query heads do not share 4 key-value heads evenly
%o = d5005.buffer "o" words 64 at 0
%q = d5005.buffer "q" words 64 at 64
%a = d5005.buffer "a" words 64 at 128
%b = d5005.buffer "b" words 64 at 192
d5005.attention %o, %q, <"k" at 0 stride 64 rows 256 cols 16 bytes 4>, <"v" at 16384 stride 64 rows 256 cols 16 bytes 4> current %a, %b heads 6 kv_heads 4
// -----
// CHECK: 'd5005.attention' op its key and value caches differ in shape
%o = d5005.buffer "o" words 64 at 0
%q = d5005.buffer "q" words 64 at 64
%a = d5005.buffer "a" words 64 at 128
%b = d5005.buffer "b" words 64 at 192
d5005.attention %o, %q, <"k" at 0 stride 64 rows 256 cols 16 bytes 4>, <"v" at 16384 stride 64 rows 128 cols 16 bytes 4> current %a, %b heads 4 kv_heads 4
// -----
// CHECK: 'd5005.program' op weights are bf16 or f32, not 'f16'
d5005.program identity "x" weights "f16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0
}
// -----
// CHECK: 'd5005.buffer' op buffer 'a' needs at least one word at an offset of at least 0
%a = d5005.buffer "a" words 0 at 0
// -----
// CHECK: 'd5005.matvec' op reaches its src in array 'inputs' or 'attended', and buffer 'b' is in 'residual'
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 0 in "residual"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 64 cols 64 bytes 2>
}
// -----
// CHECK: 'd5005.program' op buffer 'a' is in none of the engine's on-chip arrays (residual, inputs, attended, outputs, rotated)
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0
}
// -----
// CHECK: 'd5005.buffer' op buffer 'a': 'scratch' is not an on-chip array of the engine
%a = d5005.buffer "a" words 64 at 0 in "scratch"
// -----
// CHECK: 'd5005.program' op the burst is a power of two of at least 16 bytes, not 8
d5005.program identity "x" weights "f32" ctx 64 clock_mhz 300 burst 8 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
}
// -----
// CHECK: 'd5005.matvec' op streams one of 4 experts stacked in 120 rows: each expert's rows a whole number of rows of 4 (one a bank), at most 256 experts
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 0 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 120 cols 64 bytes 2> expert slot 0 of 4 routes <"routes" at 8192 stride 64 rows 4 cols 2 bytes 4>
}
// -----
// CHECK: 'd5005.route' op chooses 5 of 4 experts, not 1 to 4
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  d5005.route %a, <"routes" at 8192 stride 64 rows 4 cols 5 bytes 4> experts 4 top_k 5
}
// -----
// CHECK: 'd5005.matvec' op takes slot 2 of a route that chooses 2 experts
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 0 in "inputs"
  d5005.matvec %a, %b, <"w" at 0 stride 128 rows 128 cols 64 bytes 2> expert slot 2 of 4 routes <"routes" at 8192 stride 64 rows 4 cols 2 bytes 4>
}
// -----
// CHECK: 'd5005.expert_sum' op reaches its dst in array 'attended', and buffer 'a' is in 'outputs'
d5005.program identity "LOGOS program: decode step, ctx 64, sha256 36ba7865127a75ead80a68d1b38ee06a035b4d1b26eb1164653f00681a7913b5" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %a = d5005.buffer "a" words 64 at 0 in "outputs"
  %b = d5005.buffer "b" words 64 at 64 in "outputs"
  d5005.expert_sum %a, %b slot 0 size 64
}
