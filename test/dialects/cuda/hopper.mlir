// RUN: %logos-opt %s | %logos-opt | %filecheck %s
// RUN: %logos-opt %s --print-op-generic | %logos-opt | %filecheck %s

// The Hopper ops of the cuda dialect (mbarriers, TMA, wgmma: passes/cuda/hopper.py's products), printed in their
// custom form and parsed back.

builtin.module {
  %x = cuda.buffer "prefill.a_bf16.200x128" kind "scratch" : memref<200x128xbf16>
  %ring = cuda.shared_memory : memref<4x128x64xbf16, 3 : i64>
  %full = cuda.shared_memory : memref<4xi64, 3 : i64>
  %i = arith.constant 0 : index
  %k = arith.constant 64 : index
  cuda.mbarrier_init %full[%i], 1 : memref<4xi64, 3 : i64>
  cuda.fence_barrier_init
  cuda.mbarrier_arrive %full[%i] expect_tx 16384 : memref<4xi64, 3 : i64>
  cuda.tma_load %ring[%i, %i, %i], %full[%i], %x[%i, %k] box 128 x 64 swizzle 128 : memref<4x128x64xbf16, 3 : i64>, memref<4xi64, 3 : i64>, memref<200x128xbf16>
  cuda.mbarrier_wait %full[%i], %i : memref<4xi64, 3 : i64>
  cuda.wgmma_fence
  %a = cuda.wgmma_descriptor %ring[%i, %i, %i] leading 16 stride 1024 swizzle 128 : memref<4x128x64xbf16, 3 : i64>
  %z = arith.constant 0.0 : f32
  %d0, %d1, %d2, %d3 = cuda.wgmma %a, %a, (%z, %z, %z, %z) n 8 : f32, f32, f32, f32
  cuda.wgmma_commit
  cuda.wgmma_wait 0
  cuda.mbarrier_arrive %full[%i] : memref<4xi64, 3 : i64>
}

// CHECK:      cuda.mbarrier_init %full[%i], 1 : memref<4xi64, 3 : i64>
// CHECK-NEXT: cuda.fence_barrier_init
// CHECK-NEXT: cuda.mbarrier_arrive %full[%i] expect_tx 16384 : memref<4xi64, 3 : i64>
// CHECK-NEXT: cuda.tma_load %ring[%i, %i, %i], %full[%i], %x[%i, %k] box 128 x 64 swizzle 128 : memref<4x128x64xbf16, 3 : i64>, memref<4xi64, 3 : i64>, memref<200x128xbf16>
// CHECK-NEXT: cuda.mbarrier_wait %full[%i], %i : memref<4xi64, 3 : i64>
// CHECK-NEXT: cuda.wgmma_fence
// CHECK-NEXT: %a = cuda.wgmma_descriptor %ring[%i, %i, %i] leading 16 stride 1024 swizzle 128 : memref<4x128x64xbf16, 3 : i64>
// CHECK-NEXT: %z = arith.constant 0.000000e+00 : f32
// CHECK-NEXT: %d0, %d1, %d2, %d3 = cuda.wgmma %a, %a, (%z, %z, %z, %z) n 8 : f32, f32, f32, f32
// CHECK-NEXT: cuda.wgmma_commit
// CHECK-NEXT: cuda.wgmma_wait 0
// CHECK-NEXT: cuda.mbarrier_arrive %full[%i] : memref<4xi64, 3 : i64>
