"""Stage 1 of the GPU step: a model of PyTorch's CUDA caching allocator and the allocation sequence it is fed — what
``max_memory_allocated`` and ``max_memory_reserved`` will be, no GPU needed."""
