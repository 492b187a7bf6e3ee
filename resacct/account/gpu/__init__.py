"""The GPU step on any machine (issue 31): a model of the CUDA caching allocator
(:mod:`~resacct.account.gpu.cuda_allocator`), the record a GPU run leaves and its replay
(:mod:`~resacct.account.gpu.record`), and the step traced on fake ``cuda`` tensors
(:mod:`~resacct.account.gpu.fake_cuda_step`). docs/gpu.md says what is proven on a real board.
"""
