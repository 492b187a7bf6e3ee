"""Stage 1 of an account, **load**: the model and what goes into its step — a ``--model module:factory``
(:mod:`~resacct.account.load.model_factory`, errors in the user's own code by
:mod:`~resacct.account.load.user_code`), a transformers model from its config on the meta device
(:mod:`~resacct.account.load.hf_models`), example inputs and losses (:mod:`~resacct.account.load.model_io`),
the optimizer and its state (:mod:`~resacct.account.load.optimizers`, frozen parameters:
:mod:`~resacct.account.load.trainable`), and facts read off the model itself
(:mod:`~resacct.account.load.meta_facts`, MoE routing: :mod:`~resacct.account.load.moe_routing`)."""
