// CUDA codec kernels (placeholder).
