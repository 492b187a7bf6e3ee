"""The name of what predicts a step's peak, as every answer's ``predicted_by`` says it: kept apart from
:mod:`resacct.account.peak.step_peak` (which imports torch) so that an answer read back from the trace
cache renders without importing torch."""

__all__ = ["ENGINE"]

ENGINE = "resacct's live-storage tracker over fake CPU tensors (FakeTensorMode): the model never allocated"
