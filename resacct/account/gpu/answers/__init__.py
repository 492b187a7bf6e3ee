"""Stage 5 of the GPU step: what ``account``, ``fit``, ``lora``, ``infer`` and ``shard`` answer for ``--device BOARD``
— the predicted allocated and reserved peaks, the step time, and what calibrates them."""
