# CUDA kernels, the NCCL backend and their tests (GANG_HAVE_CUDA).
