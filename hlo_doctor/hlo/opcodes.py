"""XLA's opcode strings (``HloOpcodeString``) and the async sugar around them."""

from __future__ import annotations

OPCODES: frozenset[str] = frozenset(
    """
    abs add add-dependency after-all all-gather all-gather-done all-gather-start
    all-reduce all-reduce-done all-reduce-start all-to-all and async-done async-start
    async-update atan2 batch-norm-grad batch-norm-inference batch-norm-training bitcast
    bitcast-convert broadcast call cbrt ceil cholesky clamp clz collective-broadcast
    collective-permute collective-permute-done collective-permute-start compare complex
    concatenate conditional constant convert convolution copy copy-done copy-start
    cosine custom-call divide domain dot dynamic-reshape dynamic-slice
    dynamic-update-slice erf exponential exponential-minus-one fft floor fusion gather
    get-dimension-size get-tuple-element imag infeed iota is-finite log log-plus-one
    logistic map maximum minimum multiply negate not opt-barrier or outfeed pad
    parameter partition-id popcnt power ragged-all-to-all ragged-dot real recv recv-done
    reduce reduce-precision reduce-scatter reduce-window remainder replica-id reshape
    reverse rng rng-bit-generator rng-get-and-update-state round-nearest-afz
    round-nearest-even rsqrt scaled-dot scan scatter select select-and-scatter send
    send-done set-dimension-size shift-left shift-right-arithmetic shift-right-logical
    sign sine slice sort sqrt stochastic-convert subtract tan tanh topk transpose
    triangular-solve tuple while xor
    """.split()  # noqa: SIM905 - the table reads as XLA prints it
)

# Each opcode -> itself: the parser keeps this one string object for every instruction of an opcode.
OPCODE_STRINGS: dict[str, str] = {opcode: opcode for opcode in OPCODES}

# Printed suffix of a sugared async op -> the opcode XLA gives it.
ASYNC_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("-start", "async-start"),
    ("-update", "async-update"),
    ("-done", "async-done"),
)

COLLECTIVE_OPCODES: frozenset[str] = frozenset(
    {
        "all-gather",
        "all-reduce",
        "reduce-scatter",
        "all-to-all",
        "ragged-all-to-all",
        "collective-permute",
        "collective-broadcast",
    }
)

# Ops with their own -start/-done opcodes; `<op>-start` is never async sugar for them.
DEDICATED_ASYNC: frozenset[str] = frozenset(
    {"all-gather", "all-reduce", "collective-permute", "copy", "send", "recv"}
)

# Ops that end (or advance) an async pair.
ASYNC_DONE_OPCODES: frozenset[str] = frozenset(
    {"all-gather-done", "all-reduce-done", "collective-permute-done", "async-done", "async-update"}
)
