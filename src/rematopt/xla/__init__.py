"""What XLA compiled: its optimized, scheduled HLO read into rematopt's terms.

``hlo`` parses ``compiled.as_text()``; ``kernels`` lists the launched kernels of the entry schedule;
``memory`` gives the compiled peak, where it falls and what is live there (``assignment`` and
``heap``: XLA's CPU buffer assignment);
``flags`` says what XLA is told (and records it per measurement); ``verify`` is the closed loop
(``--verify xla``): a plan whose compiled step fits its budget.
"""

from .hlo import HloError, HloModule, Instruction, parse_hlo, read_hlo

__all__ = ["HloError", "HloModule", "Instruction", "parse_hlo", "read_hlo"]
