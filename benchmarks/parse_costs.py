"""What the files read at a command's or a claims run's start cost to parse, each way resacct has
read them (issue 34, session 9), on this machine.

    python benchmarks/parse_costs.py [--rounds 5]

Printed, in CPU milliseconds (the best of ``--rounds``): the shipped HF configs (``known.yaml``)
parsed whole by PyYAML's own parser, by libyaml's (:func:`resacct.facts.yaml_text.safe_load_text`),
and only its names read (:func:`resacct.cli._model_args.shipped_hf_config_names`, uncached); the
datasheet table by both parsers; and the shipped claims loaded with ``inspect.signature`` made anew
per call against once per check function (:mod:`resacct.harness.registry`'s cache), with how many
calls the loader made.
"""

from __future__ import annotations

import argparse
import importlib.resources
import inspect
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]


def _best_ms(work: Callable[[], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected 1 or more")
    import yaml

    from resacct.cli import _model_args
    from resacct.facts.hardware import DATA_FILE
    from resacct.facts.yaml_text import safe_load_text
    from resacct.harness import registry
    from resacct.harness import loader

    known = (REPO / "resacct" / "hf_configs" / "known.yaml").read_text(encoding="utf-8")
    table = importlib.resources.files("resacct.facts").joinpath("datasheets", DATA_FILE).read_text(encoding="utf-8")

    def names_uncached() -> list[str]:
        _model_args._shipped_hf_config_names.cache_clear()
        return _model_args.shipped_hf_config_names()

    print(f"known.yaml: PyYAML {_best_ms(lambda: yaml.safe_load(known), args.rounds):.1f} ms, "
          f"libyaml {_best_ms(lambda: safe_load_text(known), args.rounds):.1f} ms, names only {_best_ms(names_uncached, args.rounds):.2f} ms")
    print(f"{DATA_FILE}: PyYAML {_best_ms(lambda: yaml.safe_load(table), args.rounds):.1f} ms, "
          f"libyaml {_best_ms(lambda: safe_load_text(table), args.rounds):.1f} ms")

    specs = sorted((REPO / "resacct" / "specs").glob("*.claims.yaml"))
    calls = [0]
    cached = registry._signature

    def counting(function: Any) -> inspect.Signature:
        calls[0] += 1
        return inspect.signature(function)

    def load_all() -> None:
        loader._PARSED.clear()  # the loader keeps each file's parse for the process: parsed afresh here
        for path in specs:
            loader.load_claims_file(path)

    load_all()  # the check modules imported once, outside the timing
    registry._signature = counting  # type: ignore[assignment]
    try:
        anew = _best_ms(load_all, args.rounds)
    finally:
        registry._signature = cached
    print(f"the shipped claims loaded ({len(specs)} files): a signature made per call {anew:.0f} ms ({calls[0] // args.rounds:,} calls a load), "
          f"once per check function {_best_ms(load_all, args.rounds):.0f} ms")


if __name__ == "__main__":
    main()
