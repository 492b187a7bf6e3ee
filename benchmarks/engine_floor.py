"""What a traced step costs resacct against what it costs torch itself (issue 34: where verify's CPU goes).

    OMP_NUM_THREADS=1 python benchmarks/engine_floor.py [--layers 9] [--rounds 3]

One transformers model (a Llama with grouped-query attention and a GPT-2, each ``--layers`` deep, 64 wide, batch 2 × 24
tokens, fp32, AdamW) stepped three ways, interleaved round by round, CPU seconds of this process:

- *meta*: forward, loss, backward, AdamW step and zero_grad on the meta device, no dispatch mode — torch's and
  transformers' own Python and autograd for the step, shapes only: the floor of any trace;
- *fake*: the same step on a copy of the model under a bare ``FakeTensorMode`` (CPU fake tensors, as resacct traces the
  CPU step): what fake tensors add;
- *resacct*: :func:`resacct.account.peak.step_peak.predict_step_peak` on the same model — the step's peak pass (a fake copy,
  the optimizer's state made, the live-storage tracker, the optimizer's same-shape steps replayed).

Printed per model: the median of each way, and resacct ÷ fake, fake ÷ meta. The figures say where a faster trace would
have to come from: a pass that costs what a bare FakeTensorMode step costs has nothing of its own left to cut.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BATCH, SEQ = 2, 24


def _configs(layers: int) -> dict[str, Any]:
    from transformers import GPT2Config, LlamaConfig

    return {"llama-gqa": LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=160, max_position_embeddings=128),
            "gpt2": GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_inner=256, vocab_size=160, n_positions=128,
                                   bos_token_id=0, eos_token_id=0)}


def _meta_model(config: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    config._attn_implementation = "sdpa"
    config.loss_type = "ForCausalLM"
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _loss(model: Any, ids: Any) -> Any:
    return model(input_ids=ids, labels=ids).loss


def _ways(model: Any) -> dict[str, Callable[[], int | None]]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from resacct.account.peak.step_peak import predict_step_peak

    meta_ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")

    def step(module: Any, ids: Any) -> None:
        optimizer = torch.optim.AdamW(module.parameters())
        _loss(module, ids).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def meta() -> None:
        step(model, meta_ids)

    def fake() -> None:
        copied = copy.deepcopy(model)
        with FakeTensorMode(allow_non_fake_inputs=True):
            step(copied.to_empty(device="cpu"), torch.zeros(BATCH, SEQ, dtype=torch.long))

    def resacct() -> int:
        return predict_step_peak(model, meta_ids, _loss, lambda parameters: torch.optim.AdamW(parameters)).peak_bytes

    return {"meta": meta, "fake": fake, "resacct": resacct}


def _cpu_sec(run: Callable[[], Any]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=9, help="each model's depth (default 9)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three ways in turn (default 3)")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.rounds < 1:
        parser.error(f"--layers {args.layers}, --rounds {args.rounds}: expected whole numbers of 1 or more")
    import torch
    import torch._dynamo  # noqa: F401  (transformers imports it on the first build: outside the timed calls)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); batch {BATCH} × {SEQ} tokens, fp32, AdamW; "
          f"CPU seconds, median of {args.rounds} round(s) after one warm-up")
    print(f"{'model':12s} {'meta':>8s} {'fake':>8s} {'resacct':>8s} {'resacct ÷ fake':>15s} {'fake ÷ meta':>12s}")
    for name, config in _configs(args.layers).items():
        ways = _ways(_meta_model(config))
        for run in ways.values():
            run()
        seconds: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, run in ways.items():
                seconds[way].append(_cpu_sec(run))
        median = {way: statistics.median(values) for way, values in seconds.items()}
        print(f"{name:12s} {median['meta']:8.3f} {median['fake']:8.3f} {median['resacct']:8.3f} "
              f"{median['resacct'] / median['fake']:15.2f} {median['fake'] / median['meta']:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
