"""Classes of HLO ops the analyses and rules share (one list each, not one per rule)."""

from __future__ import annotations

__all__ = [
    "CONTROL_FLOW", "HEAVY", "HEAVY_CUSTOM_CALL_WORDS", "LAYOUT_ONLY", "MATMULS", "NOT_COMPUTE",
    "NOT_ELEMENTWISE", "RESHARD_COLLECTIVES",
]

# Matmul-like ops: their FLOPs are the step's compute (see hlo_doctor.semantics.cost).
MATMULS = ("dot", "convolution")

# Ops that do no work a collective could hide behind (layout and data movement are usually
# fused into their users: too little work to hide a collective).
NOT_COMPUTE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "add-dependency",
    "opt-barrier", "partition-id", "replica-id", "domain", "copy-start", "copy-done",
    "send", "send-done", "recv", "recv-done", "get-dimension-size", "iota",
    # layout and data movement, usually fused into their users: too little work to hide a collective
    "broadcast", "reshape", "convert", "bitcast-convert", "slice", "transpose", "copy", "pad", "concatenate",
})

# Ops worth overlapping whatever their output size: matmuls, loops and the like. The cost of
# other ops (elementwise, reductions, gathers, scatters) grows with the bytes they write.
HEAVY = frozenset({"dot", "convolution", "while", "conditional", "call", "fft", "triangular-solve",
                    "cholesky", "sort", "reduce-window", "select-and-scatter"})

# Words in a custom-call target that name a library matmul or convolution.
HEAVY_CUSTOM_CALL_WORDS = ("gemm", "cublas", "cudnn", "matmul", "conv")

# Ops that run other computations (their work is their bodies').
CONTROL_FLOW = frozenset({"while", "conditional", "call"})

# Ops that only relabel a value's layout (the partitioner wraps all-to-alls in them).
LAYOUT_ONLY = frozenset({"reshape", "transpose", "bitcast", "copy"})

# Ops through which a value is no longer "the same value" (not layout, not elementwise).
NOT_ELEMENTWISE = frozenset({
    "dot", "convolution", "reduce", "reduce-window", "select-and-scatter", "scatter", "gather", "sort",
    "while", "call", "conditional", "fusion", "custom-call", "rng", "parameter", "constant", "iota",
    "tuple", "get-tuple-element", "partition-id", "replica-id", "dynamic-slice", "dynamic-update-slice",
    "slice", "pad", "concatenate", "broadcast", "reverse", "infeed", "outfeed", "send", "recv",
    "send-done", "recv-done", "async-start", "async-update", "async-done", "optimization-barrier",
})

# Collectives that move a value between two shardings of it.
RESHARD_COLLECTIVES = ("all-to-all", "collective-permute")

