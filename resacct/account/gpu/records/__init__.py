"""Stage 4 of the GPU step: the GPU truth a board recorded (``tools/gpu_record.py``) — read back, replayed through the
allocator model, its steps rebuilt on meta for the ``recorded`` claims, and the step-time calibration kept beside it."""
