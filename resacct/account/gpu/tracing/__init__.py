"""Stage 2 of the GPU step: a step traced on meta tensors as a CUDA board runs it (autocast on cuda, sdpa's kernel
choice, composite kernels' temporaries, mixture-of-experts forms), its allocations into the allocator model and each
aten op's FLOPs and bytes for the step time."""
