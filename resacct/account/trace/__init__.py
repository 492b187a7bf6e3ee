"""Stage 2, **trace**: one training step run once on fake (or real) tensors and measured — FLOPs per op
and per module (:mod:`~resacct.account.trace.step_measurements`, :mod:`~resacct.account.trace.module_flops`),
the LoRA step ``resacct lora`` prices (:mod:`~resacct.account.trace.lora_step`), the step a device cannot
run accounted by prediction alone (:mod:`~resacct.account.trace.untraced`), traced answers kept on disk
(:mod:`~resacct.account.trace.cache`) and the seconds each pass took (:mod:`~resacct.account.trace.pass_profile`)."""
