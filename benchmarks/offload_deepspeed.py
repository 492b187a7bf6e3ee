"""resacct's ZeRO-Offload / ZeRO-3 estimates beside DeepSpeed's own estimator functions, figure
by figure: ``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs`` against
:func:`resacct.formulas.offload.deepspeed_options` (what ``resacct offload`` prints), over a grid
of models (DeepSpeed's docs example, Llama-2-7B/70B, a 175B GPT), GPUs per node and nodes, and
every option DeepSpeed's ``..._all_cold`` functions print.

DeepSpeed is not a dependency of resacct: install it in a throwaway environment that sees
resacct's torch, never into resacct's own virtual environment, e.g.::

    python -m venv /tmp/dsvenv
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/dsvenv/lib/python3.11/site-packages/resacct-venv.pth
    /tmp/dsvenv/bin/pip install wheel hjson ninja py-cpuinfo msgpack
    DS_BUILD_OPS=0 /tmp/dsvenv/bin/pip install --no-deps --no-build-isolation deepspeed
    PYTHONPATH=. /tmp/dsvenv/bin/python benchmarks/offload_deepspeed.py

Exits 0 when every figure agrees to the byte (DeepSpeed rounds with ``int``: so does the
comparison), 1 otherwise, 2 without DeepSpeed. ``--estimator docs`` compares the estimator of
DeepSpeed's memory docs instead (before 0.14.3): it then disagrees on ZeRO-2 without offload,
which is what the refuted claim ``deepspeed-docs-zero2-table-is-the-current-estimator`` says.

Measured on 2026-11-26 with deepspeed 0.19.8 (CPU accelerator), torch 2.13: 320 figures
(4 models × 5 layouts × 8 options × per host and per GPU), 320 agree with ``--estimator
current``; with ``--estimator docs`` 304: the 16 ZeRO-2 per-GPU figures without offload on more than
one GPU differ (on one GPU both estimators give 20 bytes a parameter).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys

from resacct.formulas.offload import deepspeed_options

# (name, parameters, largest layer's parameters): the docs' t5-3b; Llama-2-7B and 70B as
# ``resacct offload --hf-config`` counts them (largest module: the embedding); a GPT-3-sized model.
MODELS = [("t5-3b (DeepSpeed's docs)", 2851e6, 32e6), ("llama-2-7b", 6738415616, 131072000), ("llama-2-70b", 68976648192, 262144000),
          ("gpt-175b", 175e9, 1.2e9)]
LAYOUTS = [(1, 1), (8, 1), (4, 2), (8, 4), (16, 16)]  # (GPUs per node, nodes)


def _deepspeed() -> tuple[object, object, str]:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import deepspeed
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except ImportError as error:
        print(f"DeepSpeed is not importable ({error}); see this file's docstring to install it in a throwaway venv", file=sys.stderr)
        sys.exit(2)
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs, deepspeed.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimator", choices=("current", "docs"), default="current")
    args = parser.parse_args(argv)
    zero2, zero3, version = _deepspeed()
    print(f"deepspeed {version}; resacct estimator {args.estimator!r}; bytes")
    print(f"{'model':<26}{'GPUs':>9}  {'option':<46}{'DeepSpeed host':>20}{'resacct host':>20}{'DeepSpeed GPU':>17}{'resacct GPU':>17}")
    total = differ = 0
    for name, parameters, largest in MODELS:
        for per_node, nodes in LAYOUTS:
            for row in deepspeed_options(parameters, largest, gpus_per_node=per_node, nodes=nodes, estimator=args.estimator):
                if row.stage == 2:
                    host, gpu = zero2(parameters, per_node, nodes, row.offload_optimizer, 1.5)
                    option = f"ZeRO-2 optimizer={'cpu' if row.offload_optimizer else 'none'}"
                else:
                    host, gpu, _ = zero3(parameters, largest, per_node, nodes, row.offload_optimizer, row.offload_param, row.zero_init, 1.5)
                    option = (f"ZeRO-3 optimizer={'cpu' if row.offload_optimizer else 'none'} param={'cpu' if row.offload_param else 'none'} "
                              f"init={int(bool(row.zero_init))}")
                ours = (int(row.host_bytes), int(row.gpu_bytes))
                bad = [side for side, theirs, mine in (("host", host, ours[0]), ("GPU", gpu, ours[1])) if theirs != mine]
                total, differ = total + 2, differ + len(bad)
                print(f"{name:<26}{per_node:>4} × {nodes:<3}  {option:<46}{host:>20,}{ours[0]:>20,}{gpu:>17,}{ours[1]:>17,}"
                      + (f"   DIFFERS ({', '.join(bad)}; GPU {gpu / 2**30:.2f} vs {ours[1] / 2**30:.2f} GiB)" if bad else ""))
    print(f"{total - differ} of {total} figures agree to the byte")
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
