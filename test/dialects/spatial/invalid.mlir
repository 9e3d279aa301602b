// RUN: %logos-opt %s --split-input-file --verify-diagnostics | %filecheck %s

// One verifier diagnostic per case: each names the op and what is wrong.

// CHECK: 'spatial.region' op @part: element (0, 0) holds 71680 bytes, more than the 49152 bytes of memory per element
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @part on @wse2 origin [0, 0] size [1, 1] cut "decode_embed" identity "" weights "f32" {
  %w = spatial.place "w" shape [128, 128] at [0, 0, 1, 1] tile [128, 128] : tensor<128x128xf32>
}
// -----
// CHECK: 'spatial.region' op @part of 8 x 8 elements at (754, 0) does not fit the grid @wse2 of 757 x 996
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @part on @wse2 origin [754, 0] size [8, 8] cut "decode_embed" identity "" weights "f16" {
  %w = spatial.place "n" shape [1, 16] at [0, 0, 1, 1] tile [1, 16] : tensor<1x16xf16>
}
// -----
// CHECK: 'spatial.region' op @part: weights 'bf16' are not f16 or f32
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @part on @wse2 origin [0, 0] size [1, 1] cut "decode_embed" identity "" weights "bf16" {
  %w = spatial.place "n" shape [1, 16] at [0, 0, 1, 1] tile [1, 16] : tensor<1x16xf16>
}
// -----
// CHECK: 'spatial.route' op in @part reaches elements Rect(x=0, y=6, w=4, h=1) outside its region of 4 x 4
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @part on @wse2 origin [0, 0] size [4, 4] cut "decode_head" identity "" weights "f16" {
  %x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 0, 1, 0, 4, 16] : tensor<1x64xf32>
  %y = spatial.route %x colours [1] out [0, 6, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
}
// -----
// CHECK: 'spatial.route' op uses colours [30], but the grid has colours 0 to 23
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @part on @wse2 origin [0, 0] size [4, 4] cut "decode_head" identity "" weights "f16" {
  %x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 0, 1, 0, 4, 16] : tensor<1x64xf32>
  %y = spatial.route %x colours [30] out [0, 1, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
}
// -----
// CHECK: 'spatial.route' op reuses colour 3 of the stage before it, still in flight
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @part on @wse2 origin [0, 0] size [4, 4] cut "decode_head" identity "" weights "f16" {
  %x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 0, 1, 0, 4, 16] : tensor<1x64xf32>
  %y = spatial.route %x colours [3] out [0, 1, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
  %z = spatial.route %y colours [3] out [0, 2, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
}
// -----
// CHECK: 'spatial.place' op of 'w': 64 x 64 in tiles of 16 x 16 needs 4 x 4 elements, not 2 x 4
%w = spatial.place "w" shape [64, 64] at [0, 0, 2, 4] tile [16, 16] : tensor<64x64xf16>
// -----
// CHECK: 'spatial.matvec' op expects its input on Layout(x=0, y=0, dx=1, dy=0, n=4, tile=16), but it is on Layout(x=0, y=1, dx=1, dy=0, n=4, tile=16)
%x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 1, 1, 0, 4, 16] : tensor<1x64xf32>
%w = spatial.place "w" shape [64, 64] at [0, 0, 4, 4] tile [16, 16] : tensor<64x64xf16>
%y = spatial.matvec %x, %w colours [1, 2] out [3, 0, 0, 1, 4, 16] : (tensor<1x64xf32>, tensor<64x64xf16>) -> tensor<1x64xf32>
// -----
// CHECK: 'spatial.receive' op expects 64 values on its operand's layout, which holds 2 x 16
%x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 0, 1, 0, 2, 16] : tensor<1x64xf32>
// -----
// CHECK: 'spatial.map' op 'tanh' of 1 operands is not one of add, mul, silu
%x = spatial.receive "hidden" from "layer_1" colours [0] out [0, 0, 1, 0, 4, 16] : tensor<1x64xf32>
%y = spatial.map "tanh" %x out [0, 0, 1, 0, 4, 16] : (tensor<1x64xf32>) -> tensor<1x64xf32>
// -----
// CHECK: 'spatial.cache' op 2 heads of 64 positions in blocks of 16 need 4 x 2 elements, not 2 x 2
%k = spatial.cache "key" layer 0 shape [2, 64, 16] at [0, 0, 2, 2] block 16 : memref<2x64x16xf16>
