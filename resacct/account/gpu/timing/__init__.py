"""Stage 3 of the GPU step: the step time from the traced ops — a per-op roofline on a board's ceilings (a record's or
the datasheet's), or the per-op model calibrated on a board's record."""
