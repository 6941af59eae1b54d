"""HLO text -> :class:`~hlo_doctor.hlo.ir.HloModule`.

The grammar reads top-down: module header, the optional stack-frame tables,
then computations made of instructions. Instruction headers (name, shape,
opcode, operands) are parsed eagerly; attribute values are split off as raw
text and interpreted on demand by :mod:`hlo_doctor.hlo.attributes`.

Speed comes from regexes that jump over whole tokens and balanced groups, and
from caching shapes by text. Every error is a :class:`ParseError` at
``path:line:col``.
"""

from __future__ import annotations

import re

from hlo_doctor._gc import paused_gc
from hlo_doctor.hlo import fast_path  # the submodule (hlo/__init__ is not imported for it)
from hlo_doctor.hlo.async_sugar import _ASYNC_WRAPPER_KEYS, AsyncSugarReader
from hlo_doctor.hlo.ir import (
    CALLED_COMPUTATION_KEYS,
    ELEMENT_BITS,
    Computation,
    HloModule,
    Instruction,
    ModuleText,
    Position,
    Shape,
    StackFrameTables,
    called_computation_names,
    new_instruction,
)
from hlo_doctor.hlo.lexer import NAME, SPACE_MATCH, unescape
from hlo_doctor.hlo.opcodes import OPCODE_STRINGS, OPCODES
from hlo_doctor.hlo.scope import LITERAL_OPCODES, _Scope, infer_shape, make_computation
from hlo_doctor.hlo.shapes import ShapeSyntaxError, scan_shape, shape_from_text

_ATTR_KEY = re.compile(r"([A-Za-z_][\w.\-]*)\s*=")
_ARRAY_START = re.compile(r"([a-z][a-z0-9]*)\s*\[|(b)\(")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\s*\(")

class Parser(AsyncSugarReader):
    """A single-use parser over one module's text."""

    def __init__(self, text: str, path: str | None = None) -> None:
        super().__init__(text, path)
        self.computations: list[Computation] = []
        self.frame_tables: StackFrameTables | None = None
        self.origin = ModuleText(text, path, split_attributes, fast_path.scan_attribute, fast_path.scan_attributes)
        self._line = 1
        self._line_offset = 0  # offset of the text already counted into _line
        self._line_start = 0  # offset where line _line starts
        self._synthetic = 0
        self._synthetic_names: set[str] = set()

    def synthetic_computation_name(self, base: str) -> str:
        """A name for a computation the parser makes (an async wrapper, an inline body):
        ``base``, or ``base.N`` when an instruction of the same name in another inline
        body already gave one out. Computation names stay unique in a module."""
        name, count = base, 0
        while name in self._synthetic_names:
            count += 1
            name = f"{base}.{count}"
        self._synthetic_names.add(name)
        return name

    # -- positions and errors -------------------------------------------------

    def position(self, offset: int) -> Position:
        """Line:col of ``offset``; amortized O(1) as offsets mostly increase."""
        if offset < self._line_offset:
            self._line -= self.text.count("\n", offset, self._line_offset)
            self._line_start = self.text.rfind("\n", 0, offset) + 1
            self._line_offset = offset
        newlines = self.text.count("\n", self._line_offset, offset)
        if newlines:
            self._line += newlines
            self._line_start = self.text.rfind("\n", self._line_offset, offset) + 1
        self._line_offset = offset
        return Position(self._line, offset - self._line_start + 1)

    # -- module -------------------------------------------------------------------

    def parse_header(self) -> tuple[str, list[tuple[str, str]]]:
        """``HloModule name, key=value, ...``: the module name and its attributes (raw text)."""
        self.skip_space()
        if not self.parse_optional_keyword("HloModule"):
            raise self.error("expected 'HloModule' at the start of the module")
        name = self.parse_name("a module name")
        if self.peek() == ":":
            self.pos += 1
        return name, self.parse_attributes()

    def parse_module(self) -> HloModule:
        name, attributes = self.parse_header()
        self.origin.devices = _declared_devices(attributes)
        self.parse_frame_tables()
        entry_name: str | None = None
        defined: dict[str, int] = {}  # computation name -> where it starts (as XLA: names are unique)
        while self.peek():
            start = self.pos
            is_entry, computation = self.parse_computation()
            if computation.name in defined:
                first = SPACE_MATCH(self.text, defined[computation.name]).end()
                line = self.text.count("\n", 0, first) + 1
                raise self.error(f"computation '{computation.name}' is defined twice (first at line {line})",
                                 SPACE_MATCH(self.text, start).end())
            defined[computation.name] = start
            if is_entry:
                if entry_name is not None:
                    raise self.error("more than one ENTRY computation", start)
                entry_name = computation.name
        if not self.computations:
            raise self.error("module has no computations")
        if entry_name is None:
            entry_name = self.computations[-1].name
        return HloModule(
            name=name,
            computations=tuple(self.computations),
            entry_name=entry_name,
            attributes=tuple(attributes),
            frame_tables=self.frame_tables,
            path=self.path,
        )

    # -- computations -------------------------------------------------------------

    def parse_computation(self) -> tuple[bool, Computation]:
        start = self.skip_space()
        header = fast_path.COMPUTATION_HEADER.match(self.text, start)
        if header is not None:
            # The usual one-line header; the signature repeats the parameters'
            # shapes, so it is not interpreted.
            self.pos = header.end() - 1
            is_entry = header.group(1) is not None
            return is_entry, self.parse_computation_body(header.group(2), start, is_entry, [])
        is_entry = self.parse_optional_keyword("ENTRY")
        name = self.parse_name("a computation name")
        parameter_shapes: list[Shape] = []
        if self.peek() == "(":
            parameter_shapes = self.parse_signature()
        if self.peek() != "{":
            raise self.error(f"expected '{{' to open computation '{name}'")
        computation = self.parse_computation_body(name, start, is_entry, parameter_shapes)
        return is_entry, computation

    def parse_signature(self) -> list[Shape]:
        """``(p0: f32[2], p1: s32[]) -> f32[2]``; returns the parameter shapes."""
        self.expect("(")
        shapes: list[Shape] = []
        if self.peek() != ")":
            while True:
                self.parse_name("a parameter name")
                if self.peek() == ":":
                    self.pos += 1
                shapes.append(self.parse_shape())
                if self.peek() == ",":
                    self.pos += 1
                    continue
                break
        self.expect(")")
        self.expect("->")
        self.parse_shape()
        return shapes

    def parse_computation_body(
        self, name: str, start: int, is_entry: bool, parameter_shapes: list[Shape]
    ) -> Computation:
        position = self.position(start)
        text = self.text
        brace = SPACE_MATCH(text, self.pos).end()
        if not text.startswith("{", brace):
            self.expect("{")  # the error
        self.pos = brace + 1
        scope = _Scope()
        while True:
            self.pos = SPACE_MATCH(text, self.pos).end()
            self.parse_fast_instructions(scope)
            self.pos = SPACE_MATCH(text, self.pos).end()
            c = text[self.pos : self.pos + 1]
            if c == "}":
                self.pos += 1
                break
            if not c:
                raise self.error(f"unterminated computation '{name}': missing '}}'")
            self.parse_instruction(scope)
        if len(scope.roots) > 1:
            raise self.error(f"computation '{name}' has more than one ROOT", scope.roots[1].offset)
        if scope.unresolved:
            self.check_operands_defined(scope)
        execution_thread = None
        save = self.pos
        comma = SPACE_MATCH(text, save).end()
        if text.startswith(",", comma):
            self.pos = comma + 1
            if self.parse_optional_keyword("execution_thread"):
                self.expect("=")
                execution_thread = unescape(self.parse_string()[1:-1])
            else:
                self.pos = save
        computation = make_computation(
            name, scope, position, is_entry, tuple(parameter_shapes), execution_thread
        )
        self.computations.append(computation)
        return computation

    def check_operands_defined(self, scope: _Scope) -> None:
        used = set().union(*[i.operands for i in scope.instructions])
        if used <= scope.by_name.keys():
            return
        for instruction in scope.instructions:
            for operand in instruction.operands:
                if operand not in scope.by_name:
                    raise self.error(
                        f"instruction '{instruction.name}' uses '{operand}', which is not defined in its computation",
                        instruction.offset,
                    )

    # -- instructions ---------------------------------------------------------------

    def parse_instruction(self, scope: _Scope) -> str:
        start = self.pos
        is_root = self.parse_optional_keyword("ROOT")
        name = self.parse_name("an instruction name")
        if name in scope.by_name:
            raise self.error(f"instruction '{name}' is already defined in this computation", start)
        self.expect("=", f" after instruction name '{name}'")
        self.skip_space()
        shape_span: tuple[int, int] | None = None
        if self.at_shape():
            shape_span = self.scan_shape_text()
        self.skip_space()
        m = _OPCODE.match(self.text, self.pos)
        if m is None:
            raise self.error("expected an opcode followed by '('")
        opcode = m.group(1)
        opcode_offset = self.pos
        self.pos = m.end()
        literal = None
        operands: tuple[str, ...]
        if opcode in LITERAL_OPCODES:
            literal = self.scan_literal()
            operands = ()
        else:
            operands = self.parse_operands(scope)
        attributes = self.parse_attributes(scope, owner=name)
        return self.add_instruction(
            scope, name, opcode, opcode_offset, shape_span, operands, attributes, literal, is_root, start
        )

    def parse_fast_instructions(self, scope: _Scope) -> None:
        """Consume consecutive instructions the fast regex matches, from ``self.pos``.

        Stops (leaving ``self.pos`` at the next instruction or '}') at the first
        one that needs the general path.
        """
        text = self.text
        match = fast_path.INSTRUCTION_LINE.match
        instructions = scope.instructions
        by_name = scope.by_name
        origin = self.origin
        operand_names = fast_path.OPERAND_NAME.findall
        defined = by_name.get
        canonical_opcode = OPCODE_STRINGS.get
        pos = self.pos
        while True:
            m = match(text, pos)
            if m is None:
                break
            root, name, shape_text, opcode, operand_text, literal_text, attribute_text = m.groups()
            opcode = canonical_opcode(opcode)  # one string object per opcode, not one per line
            if opcode is None or name in by_name:
                break
            raw_attributes: str | int
            if attribute_text is None:
                raw_attributes = ""
            elif (
                attribute_text.count("{") != attribute_text.count("}")
                or "//" in attribute_text
                or " = " in attribute_text
            ):
                # A value that spans lines, a comment, or an inline computation
                # body: the general path handles those.
                break
            else:
                # Where the attributes start, from the instruction's start: the text is the
                # module's own, read again on demand (usually a small, shared int).
                raw_attributes = m.start(7) - pos
            try:
                shape = shape_from_text(shape_text)
            except ShapeSyntaxError:
                break
            literal = None
            if literal_text is not None:
                if opcode not in LITERAL_OPCODES:
                    break  # operands with shapes or nested instructions
                literal = literal_text.strip()
                operands: tuple[str, ...] = ()
            elif opcode in LITERAL_OPCODES:
                literal = operand_text
                operands = ()
            elif operand_text:
                # An operand is the defining instruction's own name string, not a copy.
                commas = operand_text.count(",")
                if commas == 0 and "/" not in operand_text:
                    # one bare operand (the line regex allows one leading '%'): half the lines
                    one = operand_text[1:] if operand_text[0] == "%" else operand_text
                    d = defined(one)
                    if d is None:
                        operands = (one,)
                        scope.unresolved = True
                    else:
                        operands = (d.name,)
                elif commas == 1 and "/" not in operand_text and ", %" in operand_text and operand_text[0] == "%":
                    # two, as XLA prints them: most of the rest
                    first, second = operand_text[1:].split(", %")
                    d, e = defined(first), defined(second)
                    if d is None or e is None:
                        scope.unresolved = True
                    operands = (first if d is None else d.name, second if e is None else e.name)
                else:
                    if "/" in operand_text:
                        operand_text = fast_path.BLOCK_COMMENT.sub("", operand_text)
                    names = operand_names(operand_text)
                    found = [defined(o) for o in names]
                    if any(d is None for d in found):
                        scope.unresolved = True
                    operands = tuple([o if d is None else d.name for o, d in zip(names, found, strict=True)])
            else:
                operands = ()
            is_root = root is not None
            instruction = new_instruction(name, opcode, shape, operands, pos, origin, is_root, raw_attributes, literal)
            instructions.append(instruction)
            by_name[name] = instruction
            if is_root:
                scope.roots.append(instruction)
            pos = m.end()
        self.pos = pos

    def add_instruction(
        self,
        scope: _Scope,
        name: str,
        opcode: str,
        opcode_offset: int,
        shape_span: tuple[int, int] | None,
        operands: tuple[str, ...],
        attributes: list[tuple[str, str]],
        literal: str | None,
        is_root: bool,
        start: int,
    ) -> str:
        shape = self.interpret_shape(shape_span) if shape_span is not None else None
        printed_opcode = None
        if opcode not in OPCODES:
            opcode, printed_opcode = self.desugar_async(opcode, opcode_offset)
        if shape is None:
            shape = infer_shape(opcode, operands, attributes, scope)
        called = called_computation_names(attributes)
        if printed_opcode is not None:
            called = self.wrap_async(scope, name, opcode, printed_opcode, shape, operands, attributes, called)
            attributes = [(k, v) for k, v in attributes if k in _ASYNC_WRAPPER_KEYS]
        instruction = Instruction(
            name=name,
            opcode=opcode,
            shape=shape,
            operands=operands,
            offset=start,
            origin=self.origin,
            is_root=is_root,
            raw_attributes=tuple(attributes),
            called=called,
            printed_opcode=printed_opcode,
            literal=literal,
        )
        scope.add(instruction)
        return name

    def interpret_shape(self, span: tuple[int, int]) -> Shape:
        """The shape whose text is ``self.text[start:end]`` for ``span`` = (start, end)."""
        start, end = span
        try:
            return shape_from_text(self.text[start:end])
        except ShapeSyntaxError as error:
            raise self.error(error.message, start + error.offset) from None

    def scan_shape_text(self) -> tuple[int, int]:
        """Skip the shape at ``self.pos``; its (start, end) span."""
        start = self.pos
        try:
            end = scan_shape(self.text, start)
        except ShapeSyntaxError as error:
            raise self.error(error.message, error.offset) from None
        self.pos = end
        return (start, end)

    def parse_shape(self) -> Shape:
        self.skip_space()
        return self.interpret_shape(self.scan_shape_text())

    def at_shape(self, offset: int | None = None) -> bool:
        """Does a shape (not an opcode or name) start at ``offset``?"""
        pos = self.pos if offset is None else offset
        if self.text.startswith("(", pos):
            return True
        m = _ARRAY_START.match(self.text, pos)
        return m is not None and (m.group(2) is not None or m.group(1) in ELEMENT_BITS)

    def parse_operands(self, scope: _Scope) -> tuple[str, ...]:
        """``(a, f32[2] %b, f32[] constant(0))`` after the opcode's '('."""
        operands: list[str] = []
        if self.peek() == ")":
            self.pos += 1
            return ()
        while True:
            operands.append(self.parse_operand(scope))
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            if c == ")":
                self.pos += 1
                return tuple(operands)
            raise self.error("expected ',' or ')' in the operand list")

    def parse_operand(self, scope: _Scope) -> str:
        self.skip_space()
        start = self.pos
        shape_span: tuple[int, int] | None = None
        if self.at_shape():
            shape_span = self.scan_shape_text()
            self.skip_space()
            if self.text.startswith(",", self.pos):
                # XLA also accepts `f32[], %x`: a shape, a comma, then the name.
                after = SPACE_MATCH(self.text, self.pos + 1).end()
                if not self.at_shape(after) and NAME.match(self.text, after):
                    self.pos = after
        m = _OPCODE.match(self.text, self.pos)
        if m is not None:
            # A nested instruction used as an operand: `f32[] constant(0)`.
            opcode = m.group(1)
            opcode_offset = self.pos
            self.pos = m.end()
            literal = None
            operands: tuple[str, ...] = ()
            if opcode in LITERAL_OPCODES:
                literal = self.scan_literal()
            else:
                operands = self.parse_operands(scope)
            self._synthetic += 1
            name = f"{opcode}.nested.{self._synthetic}"
            return self.add_instruction(
                scope, name, opcode, opcode_offset, shape_span, operands, [], literal, False, start
            )
        m = NAME.match(self.text, self.pos)
        if m is None:
            raise self.error("expected an operand name")
        self.pos = m.end()
        return m.group(1)

    # -- attributes -----------------------------------------------------------

    def parse_attributes(self, scope: _Scope | None = None, owner: str = "") -> list[tuple[str, str]]:
        """``, key=value`` pairs; values are kept as raw text."""
        attributes: list[tuple[str, str]] = []
        text = self.text
        while True:
            save = self.pos
            if self.peek() != ",":
                return attributes
            self.pos += 1
            self.skip_space()
            m = _ATTR_KEY.match(text, self.pos)
            if m is None:
                if scope is None:
                    self.pos = save
                    return attributes
                raise self.error("expected an attribute 'key=value'")
            key = m.group(1)
            if key == "execution_thread" and scope is None:
                self.pos = save
                return attributes
            self.pos = m.end()
            self.skip_space()
            if scope is not None and key in CALLED_COMPUTATION_KEYS and self.is_inline_body():
                value = self.parse_inline_computation(owner, key)
            else:
                value = self.scan_value(key)
            attributes.append((key, value))

    def is_inline_body(self) -> bool:
        if not self.text.startswith("{", self.pos):
            return False
        i = SPACE_MATCH(self.text, self.pos + 1).end()
        return re.match(r"(?:ROOT\s+)?%?[\w.\-]+\s*=", self.text[i : i + 200]) is not None

    def parse_inline_computation(self, owner: str, key: str) -> str:
        start = self.pos
        self._synthetic += 1
        name = self.synthetic_computation_name(f"{owner}.{key}.{self._synthetic}")
        self.parse_computation_body(name, start, False, [])
        return name

def parse_header(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The name and attributes of a module's header line, read as :func:`parse_module` reads
    them (``HloModule.attribute`` gives the same text). Raises :class:`ParseError`."""
    name, attributes = Parser(text).parse_header()
    return name, tuple(attributes)


def split_attributes(text: str, *, path: str | None = None) -> tuple[tuple[str, str], ...]:
    """Split the raw ``, key=value, ...`` text of one instruction line.

    The common form is split by one regex; anything else (comments between
    attributes, odd spacing) goes through the general attribute scanner.
    Raises ParseError (at offsets within ``text``) when the text is malformed.
    """
    pairs: list[tuple[str, str]] = []
    position = 0
    for match in fast_path.ATTRIBUTE.finditer(text):  # one pass: the matches must tile the text
        if match.start() != position:
            break
        pairs.append((match.group(1), match.group(2)))
        position = match.end()
    else:
        if position == len(text) or not text[position:].strip(" \t\r"):
            return tuple(pairs)
    parser = Parser(text, path)
    attributes = parser.parse_attributes(_Scope(), owner="")
    if parser.skip_space() != len(text):
        raise parser.error("expected ',' before the next attribute")
    return tuple(attributes)


def _entry_line_start(text: str) -> int:
    """Where the first line that starts ``ENTRY`` and a blank begins, or -1: ``str.find`` jumps
    to each candidate, far faster than a multi-line regex search through megabytes of text."""
    if text.startswith("ENTRY"):
        at = 0
    else:
        found = text.find("\nENTRY")
        at = found + 1 if found != -1 else -1
    while at != -1:
        if text[at + 5 : at + 6] in (" ", "\t"):
            return at
        found = text.find("\nENTRY", at)
        at = found + 1 if found != -1 else -1
    return -1


_PARAMETER_LINE = re.compile(r"[ \t]*%?[\w.\-]+[ \t]*=[^\n]*? parameter\(\d+\)[^\n]*")


def parse_entry_parameters(text: str, *, path: str | None = None) -> list[Instruction] | None:
    """The ENTRY computation's parameters, ordered by number, parsed from their own lines only
    (a module's header is all that is read besides). Their positions are not the file's.
    None when the text has no one-line ENTRY header; raises :class:`ParseError` when a
    parameter line does not parse (then parse the whole module)."""
    start = _entry_line_start(text)
    if start == -1:
        return None
    end = text.find("\n}", start)
    end = end if end != -1 else len(text)
    lines = []
    at = text.find(" parameter(", start, end)
    while at != -1:  # str.find jumps to the few candidate lines; the regex judges each whole line
        line_start = max(text.rfind("\n", start, at) + 1, start)
        line_end = text.find("\n", at, end)
        line_end = line_end if line_end != -1 else end
        line = text[line_start:line_end]
        if _PARAMETER_LINE.match(line):
            lines.append(line)
        at = text.find(" parameter(", line_end, end)
    first_line = text[: text.find("\n")] if "\n" in text else text
    module = parse_module(first_line + "\n\nENTRY %entry {\n" + "\n".join(lines) + "\n}\n", path=path)
    entry = module.entry
    return entry.parameters() if entry is not None else None


def parse_module(text: str, *, path: str | None = None) -> HloModule:
    """Parse one HLO module's text. Raises :class:`ParseError` on malformed text."""
    if not isinstance(text, str):
        raise TypeError("parse_module expects str; decode bytes first")
    parser = Parser(text, None if path is None else str(path))
    # The IR is acyclic and allocated in bulk (see hlo_doctor._gc).
    with paused_gc():
        try:
            return parser.parse_module()
        except RecursionError:
            raise parser.error("nesting too deep") from None


def _declared_devices(attributes: list[tuple[str, str]]) -> int | None:
    """num_partitions x replica_count of a module header (each 1 when absent); None when it declares
    neither (a hand-written module: nothing to check against) or not as integers."""
    values = dict(attributes)
    counts = [values.get(key, "1").strip() for key in ("num_partitions", "replica_count")]
    declared = "num_partitions" in values or "replica_count" in values
    return int(counts[0]) * int(counts[1]) if declared and all(c.isdigit() for c in counts) else None
