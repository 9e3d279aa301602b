// RUN: true
// A format no GGUF type is (the invalid case of storage-invalid.mlir).
%w = logos.weight "w" shape [64, 64] stored <q4_2> : tensor<64x64xf32>
