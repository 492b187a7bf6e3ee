"""The GPU step on any machine (issue 31), stage by stage:

- :mod:`~resacct.account.gpu.cuda_allocator_rules` and :mod:`~resacct.account.gpu.cuda_allocator`:
  a model of the CUDA caching allocator (allocations and frees in; allocated, reserved, segments out);
- :mod:`~resacct.account.gpu.allocation_trace`: the allocations a piece of PyTorch code makes, seen
  from the dispatcher and fed to the model;
- :mod:`~resacct.account.gpu.cuda_step`: one training step traced on meta tensors with CUDA's
  kernel choices → predicted ``max_memory_allocated`` / ``max_memory_reserved``;
- :mod:`~resacct.account.gpu.record`: the record a GPU run leaves (``tools/gpu_record.py``) and its
  replay through the model.

docs/gpu.md says which parts are proven on a real board and which await a record.
"""
