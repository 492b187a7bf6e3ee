"""Stage 3, **peak**: will it fit — the step's peak memory predicted before it runs
(:mod:`~resacct.account.peak.step_peak`), by the live-storage tracker (:mod:`~resacct.account.peak.tracker`)
plus what CPU kernels allocate unseen (:mod:`~resacct.account.peak.kernel_workspace`); precision recipes
(:mod:`~resacct.account.peak.recipes`), gradient accumulation (:mod:`~resacct.account.peak.accumulation`),
per rank under ZeRO/FSDP (:mod:`~resacct.account.peak.sharded`, measured on gloo ranks by
:mod:`~resacct.account.peak.sharded_measure`), and the small models the peak claims use
(:mod:`~resacct.account.peak.models`). The same step on a GPU it does not have: :mod:`resacct.account.gpu`."""
