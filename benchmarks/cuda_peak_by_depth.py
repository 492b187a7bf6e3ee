"""Whether the CUDA allocator model's peaks of a stack of repeated layers are affine in depth, as the
CPU engine's step peak is (issue 34: sampling depths would cut ``fit --device``'s pass over every layer).

    python benchmarks/cuda_peak_by_depth.py [--config llama-2-7b] [--seq 4096] [--depths 3 4 5] [--whole 32]

Builds a shipped config on meta at each of ``--depths`` and at ``--whole`` layers, runs
``predict_cuda_step_memory`` (fp32, batch 1, flash attention, CUDA's foreach AdamW) on each, and prints
each depth's allocated and reserved peaks and CPU seconds, then what the line through the first two
depths says at the third and at ``--whole`` against the whole trace. Measured on 2026-11-29 (2-core AMD
EPYC, llama-2-7b, seq 4096): the allocated peak on the line to the byte, the reserved peak 2.18 GB short
at 32 layers (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="llama-2-7b", help="a shipped HF config name (default llama-2-7b)")
    parser.add_argument("--seq", type=int, default=4096, help="tokens of the one sequence (default 4096)")
    parser.add_argument("--depths", type=int, nargs=3, default=[3, 4, 5], help="three small depths (default 3 4 5)")
    parser.add_argument("--whole", type=int, default=None, help="the whole depth (default: the config's own)")
    args = parser.parse_args()

    import torch

    from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
    from resacct.account.load.hf_models import HfConfigSpec, build_hf_model, known_hf_configs, repeated_depth

    spec = known_hf_configs()[args.config]
    whole = args.whole or repeated_depth(spec)[0]
    peaks: dict[int, tuple[int, int]] = {}
    for layers in (*args.depths, whole):
        values = {**spec.values, "num_hidden_layers": layers}
        model = build_hf_model(HfConfigSpec(name=f"{args.config} at {layers}", source="benchmark", values=values), device="meta")
        model.train()
        ids = torch.zeros(1, args.seq, dtype=torch.long, device="meta")
        began = time.process_time()
        predicted = predict_cuda_step_memory(model, {"input_ids": ids, "labels": ids}, lambda m, x: m(**x).loss, attention="flash")
        peaks[layers] = (predicted.peak_allocated_bytes, predicted.peak_reserved_bytes)
        print(f"{layers:4d} layers: allocated {predicted.peak_allocated_bytes:,} B, reserved {predicted.peak_reserved_bytes:,} B "
              f"({time.process_time() - began:.2f} CPU s)")
    first, second, third = args.depths
    for index, name in enumerate(("allocated", "reserved")):
        per_layer = (peaks[second][index] - peaks[first][index]) / (second - first)
        for target in (third, whole):
            line = peaks[first][index] + per_layer * (target - first)
            print(f"{name} at {target} layers: the line through {first} and {second} says {line:,.0f} B, "
                  f"the trace {peaks[target][index]:,} B ({peaks[target][index] - line:+,.0f} B)")


if __name__ == "__main__":
    main()
