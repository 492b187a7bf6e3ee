"""Stage 6, **render**: the records an account returns and how they print — the rows every account shares
(:mod:`~resacct.account.render.rows`), the GPT account's record (:mod:`~resacct.account.render.step_account`),
any model's (:mod:`~resacct.account.render.model_account`) and the memory timeline plot
(:mod:`~resacct.account.render.timeline_plot`)."""
