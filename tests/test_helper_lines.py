"""The caller's line for an op inside a helper that several lines of the user's code call, read from
the dump's frames alone (no source file, no runner record)."""

from __future__ import annotations

import shutil
from pathlib import Path

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.graph.source import helper_lines
from hlo_doctor.hlo.ir import StackFrameTables
from hlo_doctor.program.locate import SourceSettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_USER = "/home/me/train.py"
_LIBRARY = "/usr/lib/python3/site-packages/jax/_src/api.py"


def _tables(chains: list[list[tuple[str, str, int]]]) -> StackFrameTables:
    """Frame tables of the given chains (innermost first), one StackFrames entry per chain prefix, as
    XLA writes them: a frame links to its parent."""
    files: dict[str, int] = {}
    functions: dict[str, int] = {}
    locations: dict[tuple[int, int, int], int] = {}
    frames: dict[tuple[int, int], int] = {}
    for chain in chains:
        parent = 0
        for file, function, line in reversed(chain):  # outermost first
            file_id = files.setdefault(file, len(files) + 1)
            function_id = functions.setdefault(function, len(functions) + 1)
            location = locations.setdefault((file_id, function_id, line), len(locations) + 1)
            parent = frames.setdefault((location, parent), len(frames) + 1)
    return StackFrameTables(
        file_names={i: f for f, i in files.items()},
        function_names={i: f for f, i in functions.items()},
        file_locations={i: (f, g, line, None) for (f, g, line), i in locations.items()},
        stack_frames={i: (location, parent) for (location, parent), i in frames.items()},
    )


def test_a_helper_called_from_two_lines_is_one():
    main = (_USER, "main", 90)
    tables = _tables([
        [(_USER, "constrain", 10), (_LIBRARY, "jit", 5), (_USER, "step", 20), main],
        [(_USER, "constrain", 10), (_USER, "step", 21), main],
    ])
    assert helper_lines(tables) == {(_USER, 10)}


def test_a_layer_called_in_a_loop_from_one_line_is_not_one():
    tables = _tables([
        [(_USER, "block", 30), (_USER, "step", 40), (_USER, "main", 90)],
        [(_USER, "block", 31), (_USER, "step", 40), (_USER, "main", 90)],
    ])
    assert helper_lines(tables) == frozenset()


def test_a_function_traced_again_for_its_gradient_is_not_called_from_two_lines():
    # jax.checkpoint: the forward pass calls block from line 40; the backward pass traces it again
    # from line 50 (value_and_grad), which is an outer frame of line 40 in the forward chain
    tables = _tables([
        [(_USER, "block", 30), (_USER, "loss", 40), (_LIBRARY, "grad", 7), (_USER, "step", 50)],
        [(_USER, "block", 30), (_LIBRARY, "remat", 8), (_USER, "step", 50)],
    ])
    assert helper_lines(tables) == frozenset()


def test_a_plain_dump_from_another_machine_reports_the_callers_line(tmp_path):
    # the constraint-chain fixture with its program's path recorded where this machine has no file,
    # and no runner record: lines 47-50 call the helper `constrain` (line 39), and only the frames say so
    folder = tmp_path / "dump"
    shutil.copytree(FIXTURES / "constraint-chain" / "jax-shardy-bad", folder)
    (folder / "hlo_doctor_run.json").unlink()
    for path in folder.glob("*.txt"):
        path.write_text(path.read_text().replace("/work/main/hlo_doctor/examples/programs/", "/elsewhere/"))
    report = analyze_dump(folder, select=["reshard-churn"], sources=SourceSettings(gallery=False))
    (finding,) = report.findings
    assert finding.source is not None and (finding.source.file, finding.source.line) == (
        "/elsewhere/constraint_chain.py", 47)
    assert finding.evidence["helper_line"] == "/elsewhere/constraint_chain.py:39 (main.<locals>.constrain)"
    assert finding.evidence["constraint_lines"] == [48, 49, 50]


def test_constraints_in_turn_written_as_sharding_calls_are_respecified_in_place(tmp_path, monkeypatch):
    # The real constraint-chain dump, with its program's path recorded in a project here, whose
    # copy writes lines 48-50 as the sharding calls themselves instead of calls of the helper (a
    # variant of the program written for this test, with the same lines: the dump is the original's).
    # `hlo-doctor fix` writes the kept spec on each of them, and nothing else.
    from click.testing import CliRunner

    from hlo_doctor.cli import main
    from hlo_doctor.examples.registry import PROGRAMS

    monkeypatch.chdir(tmp_path)
    program = (PROGRAMS / "constraint_chain.py").read_text().splitlines(keepends=True)
    for number, spec in ((48, '(None, "data", None)'), (49, '(None, None, "data")'), (50, '(None, "data", None)')):
        assert program[number - 1].lstrip().startswith("h = constrain(h, ")
        program[number - 1] = f"        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P{spec}))\n"
    (tmp_path / "constraint_chain.py").write_text("".join(program))
    folder = tmp_path / "dump"
    shutil.copytree(FIXTURES / "constraint-chain" / "jax-gspmd-bad", folder)
    (folder / "hlo_doctor_run.json").unlink()
    for path in folder.glob("*.txt"):
        path.write_text(path.read_text().replace("/work/main/hlo_doctor/examples/programs/", f"{tmp_path}/"))
    result = CliRunner().invoke(main, ["fix", str(folder), "--select", "reshard-churn"])
    assert result.exit_code == 0, result.output
    removed = [line for line in result.stdout.splitlines() if line.startswith("-        h =")]
    added = [line for line in result.stdout.splitlines() if line.startswith("+        h =")]
    assert len(removed) == 3
    assert added == ['+        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data", None, None)))'] * 3


def test_past_a_helper_only_where_the_callers_line_holds_the_ops_value(tmp_path, monkeypatch):
    # a program written for this test: `norm`, called from two lines, returns line 3's value
    from hlo_doctor.hlo.ir import SourceLocation, StackFrame
    from hlo_doctor.rules.context import user_frame

    monkeypatch.chdir(tmp_path)
    program = tmp_path / "model.py"
    program.write_text("def norm(x, s):\n"
                       "    y = x * s\n"
                       "    return y.astype(x.dtype)\n"
                       "def block(x, s, t):\n"
                       "    h = norm(x, s)\n"
                       "    x = x + mlp(norm(h, t))\n"
                       "    return x\n")
    path = str(program)
    helpers = frozenset({(path, 2), (path, 3)})

    def line_of(inner: int, caller: int, constraint: bool = False) -> int:
        frames = (StackFrame(path, "norm", inner), StackFrame(path, "block", caller))
        found, _ = user_frame(SourceLocation(path, inner, "norm", None, frames), "block", helpers,
                              constraint=constraint)
        return found.line

    assert line_of(3, 5) == 5  # the returned value, which the caller's line assigns: the caller's line
    assert line_of(2, 5) == 2  # an op of the helper's body: its own line, where its value has a name
    assert line_of(3, 6) == 3  # returned into an expression: the caller's variable is another value
    assert line_of(2, 6, constraint=True) == 6  # a constraint is what a constraint helper returns
