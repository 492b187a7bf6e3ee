"""The out-of-cache triad's bandwidth and cost per array size, interleaved round by round.

    python benchmarks/triad_array_size.py [--rounds 4] [--mib 64 256 600]

Prints, per array size, the one-thread triad bandwidth (4 arrays moved per element, as the
roofline counts) and the seconds one roof measurement took (``measure_memory_roof``,
``max_total_sec=0.5`` as the runtime model and the verify roofline use): the evidence for the
256 MiB cap of ``resacct.measurement.triad.OUT_OF_CACHE_ARRAY_BYTES``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from resacct.measurement.measured_roofline import measure_memory_roof
from resacct.measurement.triad import last_level_cache_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--mib", type=int, nargs="+", default=[64, 256, 600], help="array sizes in MiB (default 64 256 600)")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    bandwidth: dict[int, list[float]] = {size: [] for size in arguments.mib}
    seconds: dict[int, list[float]] = {size: [] for size in arguments.mib}
    for _ in range(arguments.rounds):
        for size in arguments.mib:
            began = time.perf_counter()
            roof = measure_memory_roof(array_bytes=size * 2**20, max_total_sec=0.5)
            seconds[size].append(time.perf_counter() - began)
            bandwidth[size].append(roof.bandwidth_bytes_per_sec / 1e9)
    print(f"torch {torch.__version__}, one thread, last-level cache {last_level_cache_bytes() / 2**20:.0f} MiB, "
          f"{arguments.rounds} interleaved rounds (medians)")
    reference = statistics.median(bandwidth[arguments.mib[-1]])
    for size in arguments.mib:
        median = statistics.median(bandwidth[size])
        print(f"  {size:5d} MiB arrays: {median:6.2f} GB/s (max {max(bandwidth[size]):.2f}; ÷ {arguments.mib[-1]} MiB's {median / reference:.2f}), "
              f"{statistics.median(seconds[size]):.2f} s a roof")


if __name__ == "__main__":
    main()
