"""The CUDA runtime and the kernels: ctypes runtime calls, the counted call points of a
load, the Triton copy and quant kernels and their argument layouts."""
