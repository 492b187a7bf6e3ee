"""Stage 5, **answer**: each command's account of one model family, predicted beside measured — resacct's
GPT (:mod:`~resacct.account.answers.gpt_step`), a transformers causal LM (:mod:`~resacct.account.answers.hf`),
any ``nn.Module`` (:mod:`~resacct.account.answers.generic`, its formula chosen by
:mod:`~resacct.account.answers.providers`), and each rank of a sharded run (:mod:`~resacct.account.answers.sharded`)."""
