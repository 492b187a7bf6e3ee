"""What one ``torch.manual_seed`` costs beside ``resacct.training.seeding.seed_torch`` on this
machine, called from a shallow stack and from one as deep as pytest's (issue 34).

    python benchmarks/seed_cost.py [--calls 300] [--depth 80]

Where no accelerator is present, ``torch.manual_seed`` still queues a seeding of CUDA, XPU and MTIA
for a later initialisation, formatting the caller's whole stack for each (``torch.cuda._lazy_call``);
``seed_torch`` seeds the CPU generator alone there. Both are timed in turns, milliseconds a call,
and the draws after each are checked to be the same.
"""

from __future__ import annotations

import argparse
import time


def _per_call_ms(seed_with, calls: int) -> float:
    began = time.perf_counter()
    for index in range(calls):
        seed_with(index)
    return (time.perf_counter() - began) / calls * 1e3


def _at_depth(depth: int, work):
    return _at_depth(depth - 1, work) if depth > 0 else work()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--depth", type=int, default=80, help="frames between the call and the script's top (pytest's claims run ~60-100 deep)")
    args = parser.parse_args()
    if args.calls < 1 or args.depth < 0:
        parser.error(f"--calls {args.calls} / --depth {args.depth}: expected at least 1 / 0")
    import torch

    from resacct.training.seeding import seed_torch

    torch.manual_seed(0)  # the first call imports torch.cuda's seeding
    torch.manual_seed(7)
    expected = torch.rand(4)
    seed_torch(7)
    assert torch.equal(expected, torch.rand(4)), "seed_torch draws differ from torch.manual_seed's"
    for depth in (0, args.depth):
        for _ in range(2):
            manual = _at_depth(depth, lambda: _per_call_ms(torch.manual_seed, args.calls))
            ours = _at_depth(depth, lambda: _per_call_ms(seed_torch, args.calls))
            print(f"stack depth {depth:3d}: torch.manual_seed {manual:.3f} ms a call, seed_torch {ours:.4f} ms (ratio {manual / ours:.0f}×)")


if __name__ == "__main__":
    main()
