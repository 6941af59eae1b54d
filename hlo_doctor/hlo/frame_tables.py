"""The stack-frame tables at the top of a module (``FileNames``, ``FunctionNames``,
``FileLocations``, ``StackFrames``): the part of :class:`~hlo_doctor.hlo.parser.Parser` that reads them."""

from __future__ import annotations

import re

from hlo_doctor.hlo.ir import ModuleText, StackFrameTables
from hlo_doctor.hlo.lexer import Scanner, unescape

__all__ = ["TABLE_NAMES", "FrameTableReader"]

_TABLE_ROW = re.compile(r"(\d+)[ \t]+(\"[^\"\\]*(?:\\.[^\"\\]*)*\"|\{[^}\n]*\})")
_TABLE_FIELD = re.compile(r"(\w+)=(-?\d+)")

TABLE_NAMES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


class FrameTableReader(Scanner):
    """Reads the frame tables into ``self.frame_tables`` (and the module text's)."""

    frame_tables: StackFrameTables | None
    origin: ModuleText

    def parse_frame_tables(self) -> None:
        tables: dict[str, dict[int, object]] = {}
        while True:
            self.skip_space()
            for table in TABLE_NAMES:
                if self.parse_optional_keyword(table):
                    tables[table] = self.parse_table_rows(table)
                    break
            else:
                break
        if not tables:
            return
        file_locations = {}
        for key, fields in tables.get("FileLocations", {}).items():
            if not isinstance(fields, dict):  # a table row we cannot read: no location, as XLA tolerates
                continue
            file_locations[key] = (
                fields.get("file_name_id", 0),
                fields.get("function_name_id", 0),
                fields.get("line", 0),
                fields.get("column"),
            )
        stack_frames = {}
        for key, fields in tables.get("StackFrames", {}).items():
            if not isinstance(fields, dict):
                continue
            stack_frames[key] = (fields.get("file_location_id", 0), fields.get("parent_frame_id", 0))
        if any(parent == key for key, (_, parent) in stack_frames.items()):
            # XLA (jaxlib 0.10.2) prints parent_frame_id one higher than the
            # parent's id (a root frame shows itself as its parent); a correct
            # table never has a self-parent, so this marks the convention.
            stack_frames = {key: (location, parent - 1) for key, (location, parent) in stack_frames.items()}
        self.frame_tables = self.origin.frame_tables = StackFrameTables(
            file_names=_strings(tables.get("FileNames", {})),
            function_names=_strings(tables.get("FunctionNames", {})),
            file_locations=file_locations,
            stack_frames=stack_frames,
        )

    def parse_table_rows(self, table: str) -> dict[int, object]:
        rows: dict[int, object] = {}
        while True:
            self.skip_space()
            m = _TABLE_ROW.match(self.text, self.pos)
            if m is None:
                return rows
            self.pos = m.end()
            value = m.group(2)
            if value.startswith('"'):
                rows[int(m.group(1))] = unescape(value[1:-1])
            else:
                rows[int(m.group(1))] = {k: int(v) for k, v in _TABLE_FIELD.findall(value)}


def _strings(rows: dict[int, object]) -> dict[int, str]:
    """The rows of a table of names (a row that is not a quoted name is dropped)."""
    return {key: value for key, value in rows.items() if isinstance(value, str)}
