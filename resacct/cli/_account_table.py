"""The table ``resacct account`` prints (and :meth:`resacct.TrainingReport.render` returns): one
row per quantity, resacct's prediction beside torch's measurement, as wide as the terminal."""

from __future__ import annotations

import sys
from typing import Any

from resacct.cli.output import format_quantity

__all__ = ["DEFAULT_TABLE_COLUMNS", "table_width_columns", "render_account"]


DEFAULT_TABLE_COLUMNS = 150
"""The account table's width where nothing says another: output to a file or a pipe."""


def table_width_columns(width: int | None = None) -> int:
    """How wide the account table is drawn: ``width`` if given, else ``COLUMNS``, else the
    terminal's width when stdout is one, else :data:`DEFAULT_TABLE_COLUMNS` — at least 60."""
    import os
    import shutil

    if width is None:
        columns = os.environ.get("COLUMNS", "").strip()
        if columns.isdigit():
            width = int(columns)
        elif sys.stdout.isatty():
            width = shutil.get_terminal_size((DEFAULT_TABLE_COLUMNS, 24)).columns
        else:
            width = DEFAULT_TABLE_COLUMNS
    return max(60, width)


def render_account(account: Any, *, per_module: bool = False, units: str = "decimal", width: int | None = None) -> str:
    """The table ``resacct account`` prints, for a GPT's StepAccount or any model's ModelAccount,
    ``width`` columns wide (default: :func:`table_width_columns`)."""
    title = None
    if hasattr(account, "model_class"):
        title = (f"{account.model} ({account.model_class}): input {tuple(account.input_shape)} {account.input_dtype}, {account.loss} loss, "
                 f"{account.parameters:,} parameters, {account.recipe} {account.optimizer}, on {account.device}")
    return _render(account, per_module=per_module, title=title, units=units, width=table_width_columns(width))


def _render(account: Any, *, per_module: bool, title: str | None = None, units: str = "decimal", width: int | None = None) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, width=table_width_columns(width), no_color=True, highlight=False)
    from resacct.account.load.optimizers import optimizer_display_name

    title = title or (f"{account.model}: batch {account.batch} × seq {account.seq} = {account.tokens:,} tokens, "
             f"{account.parameters:,} parameters, {account.recipe} {optimizer_display_name(account.state.optimizer)}, {account.attention} attention, on {account.device}")
    table = Table(title=title, title_justify="left")
    for column, justify in (("section", "left"), ("quantity", "left"), ("predicted", "right"), ("measured", "right"), ("ratio", "right"), ("how / note", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    last = None
    for row in account.rows():
        ratio = "—" if row.ratio is None else f"{row.ratio:.3f}"
        table.add_row(row.section if row.section != last else "", row.quantity, format_quantity(row.predicted, row.unit, units),
                      format_quantity(row.measured, row.unit, units), ratio, row.note)
        last = row.section
    console.print(table)
    if per_module:
        modules = Table(title="per module (own matmuls and saved tensors, children apart)", title_justify="left")
        for column in ("module", "fwd FLOPs predicted", "traced", "bwd FLOPs predicted", "traced", "saved predicted", "measured"):
            modules.add_column(column, justify="left" if column == "module" else "right")
        for m in account.per_module_rows():
            modules.add_row(m.module, format_quantity(m.predicted_forward_flops, "FLOPs"), format_quantity(m.traced_forward_flops, "FLOPs"),
                            format_quantity(m.predicted_backward_flops, "FLOPs"), format_quantity(m.traced_backward_flops, "FLOPs"),
                            format_quantity(m.predicted_saved_bytes, "bytes", units), format_quantity(m.measured_saved_bytes, "bytes", units))
        console.print(modules)
    from resacct.measurement.flop_tracing import is_matmul_class

    for warning in account.flops.warnings:  # every one, never cut off
        console.print(f"warning: {warning}")
    gaps = [op for op in account.flops.uncounted_ops if not is_matmul_class(op.op)]
    if gaps:
        listed = ", ".join(f"{op.op} ×{op.calls} ({op.phase})" for op in gaps[:8]) + (f" … ({len(gaps) - 8} more in --json)" if len(gaps) > 8 else "")
        console.print(f"ops FlopCounterMode does not count (element-wise, reductions, losses): {listed}")
    for note in account.notes:
        console.print(f"note: {note}")
    return buffer.getvalue()
