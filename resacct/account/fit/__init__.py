"""Stage 4, **fit**: the largest micro-batch or sequence whose predicted peak stays within a budget
(:mod:`~resacct.account.fit.search`), from lines through a few traced probes (:mod:`~resacct.account.fit.lines`)."""
