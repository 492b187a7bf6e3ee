"""``resacct formats`` (also ``resacct dtypes``): the number formats of training — bits, exponent
and mantissa bits, the largest value, the smallest normal and subnormal, eps — and the block-scaled
MX formats. Each value is derived from the bit layout and checked against ``torch.finfo`` and
torch's reading of bit patterns by the claims in ``resacct/specs/formats.claims.yaml``.
"""

from __future__ import annotations

import argparse

from resacct.cli.output import add_json_flag, emit

__all__ = ["register"]


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.6g}"


def _run_formats(args: argparse.Namespace) -> int:
    from resacct.facts.number_formats import block_formats, format_row, number_formats

    rows = [format_row(args.name)] if args.name else list(number_formats().values())
    blocks = [] if args.name else block_formats()
    header = f"{'format':<10} {'bits':>4} {'e':>2} {'m':>2} {'bias':>4} {'max':>12} {'min normal':>12} {'min subnormal':>13} {'eps':>10}  inf nan  torch"
    lines = [header]
    for row in rows:
        lines.append(f"{row.name:<10} {row.bits:>4} {row.exponent_bits:>2} {row.mantissa_bits:>2} {row.exponent_bias:>4} {_number(row.max_value):>12} "
                     f"{_number(row.smallest_normal):>12} {_number(row.smallest_subnormal):>13} {_number(row.eps):>10}  "
                     f"{'yes' if row.infinities else 'no':<3} {'yes' if row.nan else 'no':<3}  {row.torch_dtype or '—'}")
    if args.name:
        lines += [f"  aliases: {', '.join(rows[0].aliases)}; stored in {rows[0].storage_bits} bits", f"  source: {rows[0].source}"]
    if blocks:
        lines += ["", "block-scaled formats: elements sharing one scale per block"]
        lines += [f"  {b.name:<11} {b.block_size:>2} × {b.element:<9} + one {b.scale:<8} scale = {b.bits_per_value:g} bits a value  ({b.source})" for b in blocks]
    fields = {"formats": [row.as_fields() for row in rows],
              "block_formats": [{"name": b.name, "element": b.element, "block_size": b.block_size, "scale": b.scale,
                                 "bits_per_value": b.bits_per_value, "source": b.source} for b in blocks]}
    return emit(args, fields, "\n".join(lines))


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, summary in (("formats", "number formats: bits, exponent/mantissa, max, smallest normal and subnormal, eps; MX block formats"),
                          ("dtypes", "the same as 'resacct formats'")):
        parser = subparsers.add_parser(name, help=summary, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                       epilog="examples:\n  resacct formats\n  resacct formats e4m3 --json")
        parser.add_argument("name", nargs="?", help="show one format (fp32, tf32, bf16, fp16, fp8_e4m3 / e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1, e8m0 …)")
        add_json_flag(parser)
        parser.set_defaults(run=_run_formats)
