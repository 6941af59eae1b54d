"""What the oracle reads differently in a torch_xla program: the phase, and the FLOPs.

**The phase.** torch_xla's ``XLA_HLO_DEBUG=1`` metadata has no
``transpose(jvp(...))``; what it has (checked on torch_xla 2.9 dumps, and the
collectives the partitioner makes keep their op's metadata):

- forward ops carry the Python frame that made them (``source_file``): the
  library's or the program's line (``torch/nn/modules/linear.py:134``);
- backward ops run on autograd's engine thread, where there is no Python frame:
  they carry ``op_type`` (``aten__mm``, ``aten__nll_loss_backward``) and no
  ``source_file``; the seed of ``loss.backward()`` is made under
  ``torch/autograd/``;
- the optimizer's update carries ``torch/optim/*.py`` lines.

An op with no metadata at all is ``unknown``: the oracle then decides from the
registry alone (a reduction whose result reaches a weight update elementwise
is a gradient), as it does for any phase but the forward.

**FLOPs.** torch_xla has no ``cost_analysis()``; the redundancy of a program
is the dots' FLOPs per device in the partitioned module (this reader's own
count: 2 x result elements x contracted size) against the dots' FLOPs of the
module before partitioning, divided by the devices.
"""

from __future__ import annotations

import re

from corpusgen.hlo_walk import Instr, Module

__all__ = ["dot_flops", "torch_phase"]

_SOURCE_FILE = re.compile(r'source_file="([^"]*)"')
_OP_TYPE = re.compile(r'op_type="([^"]*)"')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")


def torch_phase(instr: Instr) -> str:
    """forward | backward | optimizer | unknown, from torch_xla's metadata (see the module docstring)."""
    attributes = instr.attributes
    source = _SOURCE_FILE.search(attributes)
    if source is not None:
        path = source.group(1).replace("\\", "/")
        if "/torch/optim/" in path:
            return "optimizer"
        if "/torch/autograd/" in path:
            return "backward"
        return "forward"
    op_type = _OP_TYPE.search(attributes)
    if op_type is None:
        return "unknown"
    return "backward"


def dot_flops(module: Module) -> float:
    """2 x result elements x contracted size, summed over every dot of the module."""
    total = 0.0
    for instr in module.instructions():
        if instr.opcode != "dot":
            continue
        lhs = module.by_name.get((instr.computation, instr.operands[0]))
        match = _CONTRACTING.search(instr.attributes)
        contracted = 1
        if lhs is not None and match:
            for d in match.group(1).split(","):
                if d:
                    contracted *= lhs.dims[int(d)]
        total += 2.0 * instr.elements * contracted
    return total
