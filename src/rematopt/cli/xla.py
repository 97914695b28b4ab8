"""``rematopt xla ...``: what XLA compiled, read from its optimized HLO text."""

from __future__ import annotations

import click

from ..sizes import human_bytes
from .common import emit_json


@click.group(name="xla")
def xla_group() -> None:
    """Read XLA's compiled program (compiled.as_text()) in rematopt's terms."""


@xla_group.command(name="memory")
@click.argument("hlo_file", type=click.Path())
@click.option("--backend", type=click.Choice(["auto", "cpu", "gpu", "tpu"]), default="auto", show_default=True,
              help="Count memory as XLA does on this backend (auto: the one the module was compiled for).")
@click.option("--top", type=int, default=10, show_default=True, help="Live buffers to list at the peak.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (peak_bytes, where, what is live).")
def memory_cmd(hlo_file: str, backend: str, top: int, as_json: bool) -> None:
    """Peak memory of HLO_FILE's scheduled entry computation, where in the schedule it falls,
    and what is live there (with each buffer's op_name and source line)."""
    from ..xla.hlo import read_hlo
    from ..xla.memory import backend_of, compiled_memory

    module = read_hlo(hlo_file)
    chosen = backend_of(module) if backend == "auto" else backend
    result = compiled_memory(module, chosen)
    compare = ("peak_memory_in_bytes" if chosen != "cpu" else
               "temp + arguments + outputs - aliases (XLA computes no peak on CPU)")
    if as_json:
        emit_json({"file": hlo_file, "module": module.name, "backend": chosen, "compare_with": compare,
                   "instructions": len(module.schedule), **result.summary()})
        return
    click.echo(f"{hlo_file}: {module.name} ({chosen}), {len(module.schedule)} scheduled instructions")
    holding = sum(b.holds.bytes for b in result.live if b.holds)
    holding = f" ({human_bytes(holding)} of them holding temporaries)" if holding else ""
    parts = (f"parameters {human_bytes(result.parameter_bytes)}, outputs {human_bytes(result.output_bytes)}{holding}, "
             f"temporaries {human_bytes(result.temp_peak_bytes)}")
    if result.heap_bytes is None:  # GPU / TPU: XLA's figure is the live peak
        click.echo(f"peak {human_bytes(result.peak_bytes)} ({result.peak_bytes:,} B) at {result.where}: {parts}")
    else:  # CPU: XLA's figure is what it allocates, the temporaries' heap with its gaps
        gaps = result.peak_bytes - result.live_peak_bytes
        click.echo(f"allocated {human_bytes(result.peak_bytes)} ({result.peak_bytes:,} B): parameters "
                   f"{human_bytes(result.parameter_bytes)}, outputs {human_bytes(result.output_bytes)}, temp "
                   f"{human_bytes(result.heap_bytes)} ({result.heap_bytes:,} B)")
        click.echo(f"live peak {human_bytes(result.live_peak_bytes)} ({result.live_peak_bytes:,} B) at "
                   f"{result.where}: {parts} ({human_bytes(gaps)} of temp is the heap's gaps)")
    click.echo(f"XLA's own figure to compare with: {compare}")
    # the temporaries, and on CPU those XLA keeps in an output's allocation until the output is written
    temps = [(b, "") for b in result.live if b.kind == "temp"]
    temps += [(b.holds, f"(in output {b.instruction}'s allocation)") for b in result.live if b.holds]
    temps = sorted(temps, key=lambda t: -t[0].bytes)[:top]
    if temps:
        click.echo("largest temporaries live at the peak:")
    for b, housed in temps:
        index = "{" + ",".join(map(str, b.index)) + "}" if b.index else ""
        click.echo("  ".join(filter(None, [f"  {human_bytes(b.bytes):>10}", b.instruction + index, b.op_name,
                                           b.source, housed])))
