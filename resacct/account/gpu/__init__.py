"""The GPU step on any machine (issue 31), read as its pipeline — one folder per stage:

- ``allocator/``: the model of PyTorch's CUDA caching allocator (:mod:`.allocator.cuda_allocator_rules`,
  :mod:`.allocator.cuda_allocator`: allocations and frees in; allocated, reserved, segments out) and the library
  workspaces it never sees (:mod:`.allocator.library_workspaces`: cuBLAS/cuBLASLt) — it imports no later stage;
- ``tracing/``: one training step (or a decode step) traced on meta tensors as CUDA would run it — autocast, sdpa's
  kernels, composites' temporaries, the experts' forms (:mod:`.tracing.cuda_step`) — fed to the allocator model by the
  dispatcher-side recorder (:mod:`.tracing.allocation_trace`), and each op's FLOPs and bytes (:mod:`.tracing.op_costs`);
- ``timing/``: the step time from those ops — the per-op roofline (:mod:`.timing.step_time`), the model calibrated on a
  board's record (:mod:`.timing.step_time_calibrated`) and which one a board gets (:mod:`.timing.board_rates`);
- ``records/``: a GPU run's record (``tools/gpu_record.py``) read back, replayed and its steps rebuilt on meta
  (:mod:`.records.board_record`, :mod:`.records.record_models`, :mod:`.records.recorded_history`), and the calibration
  kept beside it (:mod:`.records.record_calibration`);
- ``answers/``: what the commands print for ``--device BOARD`` (:mod:`.answers.device_answer`,
  :mod:`.answers.command_answers`, :mod:`.answers.sharded_cuda`, the batch search by the reserved peak
  :mod:`.answers.reserved_search`, and the board's step traced beside ``fit``'s search :mod:`.answers.traced_beside`).

docs/gpu.md says which parts are proven on a real board and which await a record.
"""
