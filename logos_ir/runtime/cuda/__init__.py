"""The CUDA lane's runtime: runs the lane's build (the kernels and the host plan) on a GPU, or emulated on the CPU.

A build of the CUDA lane holds `step.mlir` (the lowered module: `gpu.module @kernels` and the host function `@step`
of named buffers, ordered `gpu.launch_func`, `shard.all_reduce` and a split head's `shard.all_gather`) and
`kernels.cu` (the same kernels as CUDA C++). The runtime reads those artifacts and nothing of the lowering:
`artifacts` (the build a run executes, from a folder or through the registry's compile target), `emulator` and
`tensor_core` (the `gpu.func` bodies executed on the CPU, with `lockstep` the shape both compile to), `weights`
(each chip's weight shares and the host's tables), `devices` (the emulator and the cupy GPU behind one interface),
`ranks` (in-process chips, MPI, NCCL), `host` (the host plan's orchestration: buffers, launches, collectives,
graphs), `generator` (the `cuda` backend of `logos-run`) and `agreement` (teacher-forced agreement with the
reference).
"""
