"""Measurement: what torch itself reports — FLOPs traced with FlopCounterMode, honest timing,
this machine's measured roofline, a training step's time predicted op by op beside the clock."""
