"""Formulas: resacct's predictions in closed form — napkin math, compute-optimal sizing, MFU,
the roofline, the exact FLOPs and saved-activation bytes of its GPT and of linear stacks. They read
facts (:mod:`resacct.facts`) and never measure; every one is checked against a measurement."""
