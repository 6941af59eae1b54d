"""Output formats, one module each. They only render a :class:`~hlo_doctor.analysis.Report`.

* :mod:`hlo_doctor.report.text`: rich text for a terminal (``--format text``);
* :mod:`hlo_doctor.report.json`: JSON, schema version 1 (``--format json``,
  documented in ``docs/json-schema-v1.md``, schema in ``schema-v1.json``).
"""

FORMATS = ("text", "json")

__all__ = ["FORMATS"]
