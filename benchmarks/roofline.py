"""Measure this machine's roofline and where a few operations sit on it; print and plot it.

    python benchmarks/roofline.py --out roofline.png            # CPU, one thread (resacct.measurement.measured_roofline)
    python benchmarks/roofline.py --threads 2 --out roofline.png
    python benchmarks/roofline.py --cuda --out roofline-gpu.png  # GPU 0, CUDA events

The two ceilings are measured, not looked up. On the CPU (resacct.measurement.measured_roofline): a STREAM
triad over arrays past the last-level cache gives the memory roof (bytes/s, the write-allocate read
counted), the best of 192³, 320³, 384³ and 512³ matmuls the compute roof (FLOP/s); each element-wise
point also gets a triad of its own tensor size, and each matmul point's samples sit between samples
of every roof size. Samples are this thread's CPU time (one thread); roofs and points alike are the
best sample. The table shows each point's best and median; the plot shows the best. With --cuda
(resacct.measurement.perf): a large copy and a large matmul, CUDA events.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

from resacct.measurement.perf import measure_ceilings, measure_operation, save_roofline_png

CPU_OPERATIONS = [("copy", 2**24), ("add", 2**24), ("relu", 2**24), ("gelu", 2**24), ("matvec", 4096),
                  ("matmul", 128), ("matmul", 512), ("matmul", 1024)]
CUDA_OPERATIONS = [("copy", 2**28), ("add", 2**28), ("relu", 2**28), ("gelu", 2**28), ("matvec", 16384),
                   ("matmul", 512), ("matmul", 2048), ("matmul", 8192)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="roofline.png", help="where to write the plot (default: roofline.png)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default: 1)")
    parser.add_argument("--cuda", action="store_true", help="measure CUDA device 0")
    parser.add_argument("--dtype", default=None, help="matmul/element dtype (default: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    device = "cuda" if args.cuda else "cpu"
    if not args.cuda:
        return _cpu(args)
    if args.cuda and not torch.cuda.is_available():
        print("roofline: --cuda given but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if args.cuda else "float32")
    threads = None if args.cuda else args.threads
    if args.cuda:
        ceilings = measure_ceilings(device=device, dtype=dtype, matmul_size=8192, copy_bytes=2**30)
        operations = CUDA_OPERATIONS
        name = torch.cuda.get_device_name(0)
    else:
        ceilings = measure_ceilings(device=device, dtype=dtype, thread_count=threads)
        operations = CPU_OPERATIONS
        name = platform.processor() or platform.machine()
    roofline = ceilings.roofline

    print(f"machine: {name}; torch {torch.__version__}; {roofline.name}")
    print(f"memory roof : {ceilings.bandwidth_bytes_per_sec / 1e9:8.1f} GB/s      (copy of {ceilings.copy_bytes / 2**20:.0f} MiB, "
          f"best of {len(ceilings.copy_timing.samples_sec)}, spread {ceilings.copy_timing.spread:.2f}×)")
    print(f"compute roof: {ceilings.peak_flops_per_sec / 1e9:8.1f} GFLOP/s  ({ceilings.matmul_size}³ {dtype} matmul, "
          f"best of {len(ceilings.matmul_timing.samples_sec)}, spread {ceilings.matmul_timing.spread:.2f}×)")
    print(f"ridge point : {roofline.ridge_point_flops_per_byte:8.2f} FLOP/byte\n")
    print(f"{'operation':<16}{'FLOP/byte':>10}{'roof':>9}{'best':>9}{'median':>9}{'best/roof':>10}{'best GB/s':>10}{'median ms':>10}  bound")
    print(f"{'':<16}{'':>10}{'GFLOP/s':>9}{'GFLOP/s':>9}{'GFLOP/s':>9}")

    records, points = [], []
    for operation, size in operations:
        measured = measure_operation(operation, size, dtype=dtype, device=device, thread_count=threads, repeats=7)
        intensity = measured.intensity_flops_per_byte
        attainable = roofline.attainable_flops_per_sec(intensity) if intensity > 0 else 0.0
        best = measured.flops / measured.timing.best_sec
        median = measured.achieved_flops_per_sec
        best_bytes = measured.bytes_moved / measured.timing.best_sec
        bound = roofline.bound(intensity) if intensity > 0 else "memory"
        share = f"{best / attainable:10.0%}" if attainable else f"{'—':>10}"
        print(f"{operation + ' ' + str(size):<16}{intensity:>10.3g}{attainable / 1e9:>9.3g}{best / 1e9:>9.3g}{median / 1e9:>9.3g}{share}"
              f"{best_bytes / 1e9:>10.1f}{measured.timing.median_sec * 1e3:>10.3f}  {bound}")
        records.append({"operation": operation, "size": size, "intensity_flops_per_byte": intensity, "attainable_flops_per_sec": attainable,
                        "best_flops_per_sec": best, "median_flops_per_sec": median, "best_bytes_per_sec": best_bytes,
                        "median_sec": measured.timing.median_sec, "samples_sec": list(measured.timing.samples_sec), "bound": bound})
        if intensity > 0:
            points.append((f"{operation} {size}", intensity, best))

    save_roofline_png(args.out, roofline, points, title=f"Roofline — {name}, {roofline.name}")
    print(f"\nwrote {args.out}")
    if args.json:
        document = {"machine": name, "torch": torch.__version__, "roofline": {"name": roofline.name,
                    "peak_flops_per_sec": roofline.peak_flops_per_sec, "bandwidth_bytes_per_sec": roofline.bandwidth_bytes_per_sec,
                    "ridge_point_flops_per_byte": roofline.ridge_point_flops_per_byte}, "operations": records}
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
        print(f"wrote {args.json}")
    return 0


def _cpu(args: argparse.Namespace) -> int:
    """The CPU roofline of resacct.measurement.measured_roofline: triad and matmul roofs, other kernels as points."""
    from resacct.measurement.measured_roofline import DEFAULT_POINTS, measure_machine_roofline, save_measured_roofline_png

    dtypes = tuple(dict.fromkeys(["float32", *([args.dtype] if args.dtype else [])]))
    measured = measure_machine_roofline(dtypes=dtypes, points=DEFAULT_POINTS, thread_count=args.threads)
    memory = measured.memory
    print(f"machine: {platform.processor() or platform.machine()}; torch {torch.__version__}; {measured.threads} thread(s)")
    print(f"memory roof : {memory.bandwidth_bytes_per_sec / 1e9:8.1f} GB/s moved (STREAM triad over 3 × {memory.array_bytes / 2**20:.0f} MiB, "
          f"write-allocate counted; {memory.stream_bytes_per_sec / 1e9:.1f} GB/s as STREAM counts; best of {len(memory.samples_sec)})")
    for dtype, roof in measured.compute.items():
        print(f"compute roof: {roof.peak_flops_per_sec / 1e9:8.1f} GFLOP/s {dtype} ({roof.size}³ matmul, best of {len(roof.samples_sec)}); "
              f"ridge {roof.peak_flops_per_sec / memory.bandwidth_bytes_per_sec:.2f} FLOP/byte")
    print("clock: this thread's CPU time (one thread); every roof and point value is its best sample; an element-wise point's\n"
          "memory roof is the better of the triad above and a triad over arrays of its own size (own triad), sampled around it")
    print(f"\n{'operation':<40}{'FLOP/byte':>10}{'roof GFLOP/s':>13}{'best':>9}{'median':>9}{'of roof':>9}{'own triad':>11}  bound")
    for point in measured.points:
        own = f"{point.memory_roof_bytes_per_sec / 1e9:.1f} GB/s" if point.memory_roof_bytes_per_sec else "—"
        if point.flops == 0:
            print(f"{point.label:<40}{0:>10}{'—':>13}{'—':>9}{'—':>9}{'—':>9}{own:>11}  memory ({point.bytes_moved / min(point.samples_sec) / 1e9:.1f} GB/s)")
            continue
        median = point.flops / sorted(point.samples_sec)[len(point.samples_sec) // 2]
        print(f"{point.label:<40}{point.intensity_flops_per_byte:>10.3g}{measured.attainable_flops_per_sec(point) / 1e9:>13.3g}"
              f"{point.best_flops_per_sec / 1e9:>9.3g}{median / 1e9:>9.3g}{measured.share_of_roof(point):>9.1%}{own:>11}  {measured.bound(point)}")
    save_measured_roofline_png(args.out, measured)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
