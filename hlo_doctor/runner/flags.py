"""Read, merge and write the ``XLA_FLAGS`` string.

XLA reads ``XLA_FLAGS`` as whitespace-separated ``--name=value`` (or bare
``--name``) tokens. The runner adds its dump flags to the user's own without
dropping any of them: ours win only where the dump needs them to
(``--xla_dump_to``), a pass regex is widened, never narrowed.
"""

from __future__ import annotations

import shlex

DUMP_PASS_RE = "spmd|propagation|shardy-verbose"


def parse_xla_flags(text: str) -> dict[str, str | None]:
    """``"--a=1 --b"`` -> ``{"xla_a": "1", "xla_b": None}``, in order; the last repeat wins."""
    flags: dict[str, str | None] = {}
    for token in shlex.split(text or ""):
        name, sep, value = token.lstrip("-").partition("=")
        if not name:
            continue
        flags.pop(name, None)
        flags[name] = value if sep else None
    return flags


def format_xla_flags(flags: dict[str, str | None]) -> str:
    tokens = []
    for name, value in flags.items():
        if value is None:
            tokens.append(f"--{name}")
        elif any(c.isspace() for c in value) or '"' in value:
            tokens.append(f'--{name}="{value}"')
        else:
            tokens.append(f"--{name}={value}")
    return " ".join(tokens)


def _widen_regex(user: str | None, ours: str) -> str:
    if not user or user == ours:
        return ours
    return f"{user}|{ours}"


def merge_xla_flags(user: str | None, ours: dict[str, str | None]) -> str:
    """The user's flags plus ours.

    Every user flag is kept. ``xla_dump_to`` and ``xla_force_host_platform_device_count``
    take our value; ``xla_dump_hlo_pass_re`` becomes the alternation of both.
    """
    merged = parse_xla_flags(user or "")
    for name, value in ours.items():
        if name == "xla_dump_hlo_pass_re" and value is not None:
            merged[name] = _widen_regex(merged.get(name), value)
        else:
            merged[name] = value
    return format_xla_flags(merged)
