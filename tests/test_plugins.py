"""Rule plugins: discovery through fake entry points, crashes, id clashes, import failures,
API versions, --strict-plugins, per-rule options from the config file, the public
``hlo_doctor.plugin`` module, ``hlo_doctor.testing``, and the installed example plugin.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor import __version__, plugin
from hlo_doctor.analysis import analyze_dump
from hlo_doctor.cli import main
from hlo_doctor.rules import registry as registry_module
from hlo_doctor.rules.versioning import API_VERSION, api_version_problem, satisfies
from hlo_doctor.testing import (
    assert_case,
    builtin_rule_ids,
    find_cases,
    load_case,
    run_case,
)
from tests import plugin_fakes

ROOT = Path(__file__).resolve().parents[1]
UNEVEN_BAD = ROOT / "fixtures" / "uneven-padding" / "jax-shardy-bad"
GROUP = "hlo_doctor.rules"
BUILTIN_POINTS = [p for p in metadata.entry_points(group=GROUP) if p.value.startswith(registry_module.BUILTIN_PREFIX)]
EXAMPLE_PLUGIN = "hlo-doctor-moe-rules"


class _FakeDistribution(metadata.Distribution):
    """Installed-package metadata for a plugin that exists only in this test."""

    def __init__(self, name: str, version: str) -> None:
        self._metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename):
        return self._metadata if filename in ("METADATA", "PKG-INFO") else None

    def locate_file(self, path):  # pragma: no cover - not used
        return Path(path)


def _point(name: str, target: str, dist: tuple[str, str] | None = ("fake-plugin", "1.0")) -> EntryPoint:
    value = target if ":" in target else f"tests.plugin_fakes:{target}"
    point = EntryPoint(name, value, GROUP)
    return point._for(_FakeDistribution(*dist)) if dist is not None else point


@pytest.fixture
def plugins(monkeypatch):
    """Install fake plugins: ``plugins(point, ...)``; the built-in rules stay registered."""

    def install(*points: EntryPoint) -> None:
        # reversed, so the registry's own sorting is what puts them in order
        everything = list(reversed([*BUILTIN_POINTS, *points]))
        monkeypatch.setattr(registry_module, "entry_points", lambda group: everything if group == GROUP else [])

    return install


def _cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def _expected_builtin_keys(folder: Path) -> set:
    return set(load_case(folder).expected)


# -- a crashing plugin rule ----------------------------------------------------------------

def test_crashing_plugin_rule_is_an_internal_error_and_every_other_rule_still_reports(plugins):
    plugins(_point("crashing-plugin-rule", "CrashingRule"), _point("hello-plugin-rule", "HelloRule"))
    report = analyze_dump(UNEVEN_BAD)
    assert {"crashing-plugin-rule", "hello-plugin-rule", *builtin_rule_ids()} == set(report.rules)
    crash = [f for f in report.findings if f.rule == "internal-error"]
    assert len(crash) == len(report.modules) == 1
    assert "rule crashing-plugin-rule crashed" in crash[0].message and "KeyError" in crash[0].message
    assert "plugin_fakes.py" in crash[0].message  # where it crashed
    keys = {(f.rule, f.instruction, f.source.line if f.source else None) for f in report.findings}
    assert _expected_builtin_keys(UNEVEN_BAD) <= keys  # the built-in rules still found what they find
    assert any(f.rule == "hello-plugin-rule" for f in report.findings)

    result = _cli("analyze", UNEVEN_BAD, "--format", "json")
    assert result.exit_code == 0, result.output
    rules = sorted({f["rule"] for f in json.loads(result.stdout)["findings"]})
    assert rules == ["hello-plugin-rule", "internal-error", "uneven-sharding-padding"]


# -- id clashes ----------------------------------------------------------------------------

def test_id_clash_between_two_plugins_is_reported_and_the_first_keeps_the_id(plugins):
    plugins(
        _point("zz-second", "SecondDuplicate", ("second-plugin", "2.0")),
        _point("aa-first", "FirstDuplicate", ("first-plugin", "1.0")),
    )
    registry = registry_module.discover()
    spec = registry.get("duplicate-rule")
    assert spec.rule is plugin_fakes.FirstDuplicate and spec.origin == "plugin first-plugin==1.0"
    (error,) = registry.errors
    assert error.origin == "plugin second-plugin==2.0"
    assert "rule id 'duplicate-rule' is already registered by aa-first = tests.plugin_fakes:FirstDuplicate " \
           "(plugin first-plugin==1.0)" in error.message

    result = _cli("rules")
    assert result.exit_code == 0
    assert result.stdout.count("duplicate-rule") == 1 and "plugin first-plugin==1.0" in result.stdout
    assert "rule plugin zz-second = tests.plugin_fakes:SecondDuplicate (plugin second-plugin==2.0) not loaded" \
           in result.stderr

    result = _cli("analyze", UNEVEN_BAD, "--format", "json")
    assert result.exit_code == 0, result.output
    errors = json.loads(result.stdout)["errors"]
    assert any("already registered" in e["message"] for e in errors)


def test_a_plugin_cannot_take_a_builtin_rules_id(plugins):
    plugins(_point("aaa", "ShadowsBuiltin"))  # sorts before every built-in entry point name
    registry = registry_module.discover()
    assert registry.get("uneven-sharding-padding").is_builtin
    (error,) = registry.errors
    assert "already registered by uneven-sharding-padding = " in error.message and "(builtin)" in error.message


def test_discovery_is_sorted_and_deterministic(plugins):
    plugins(_point("hello-plugin-rule", "HelloRule"), _point("crashing-plugin-rule", "CrashingRule"),
            _point("broken-b", "no_such_module_b:Rule"), _point("broken-a", "no_such_module_a:Rule"))
    first = registry_module.discover()
    assert first.ids() == sorted(first.ids())
    assert [e.entry_point for e in first.errors] == ["broken-a", "broken-b"]
    second = registry_module.discover()
    assert [(s.id, s.origin) for s in second.rules.values()] == [(s.id, s.origin) for s in first.rules.values()]


# -- a plugin that fails to import -------------------------------------------------------------

def test_import_failing_plugin_is_reported_and_skipped(plugins):
    plugins(_point("broken", "no_such_module_xyz:SomeRule"), _point("missing-class", "NoSuchClass"),
            _point("hello-plugin-rule", "HelloRule"))
    registry = registry_module.discover()
    assert "hello-plugin-rule" in registry.ids() and set(builtin_rule_ids()) <= set(registry.ids())
    messages = {e.entry_point: e.message for e in registry.errors}
    assert "failed to load no_such_module_xyz:SomeRule: ModuleNotFoundError" in messages["broken"]
    assert "AttributeError" in messages["missing-class"]

    result = _cli("analyze", UNEVEN_BAD, "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {"broken", "missing-class"} <= {e["path"] for e in document["errors"]}
    assert "hello-plugin-rule" in {f["rule"] for f in document["findings"]}

    text = _cli("analyze", UNEVEN_BAD)
    assert text.exit_code == 0 and "no_such_module_xyz" in text.output

    listing = _cli("rules")
    assert listing.exit_code == 0 and "hello-plugin-rule" in listing.stdout
    assert "warning: rule plugin broken (plugin fake-plugin==1.0) not loaded" in listing.stderr


@pytest.mark.parametrize("command", [
    ("analyze", UNEVEN_BAD), ("check", UNEVEN_BAD), ("rules",), ("rules", "uneven-sharding-padding"),
], ids=["analyze", "check", "rules", "rules-id"])
def test_strict_plugins_exits_2_when_a_plugin_is_not_loaded(plugins, command):
    plugins(_point("broken", "no_such_module_xyz:SomeRule"))
    result = _cli(*command, "--strict-plugins")
    assert result.exit_code == 2, result.output
    assert "error: rule plugin broken (plugin fake-plugin==1.0) not loaded: failed to load" in result.stderr
    assert "1 rule plugin not loaded (--strict-plugins)" in result.stderr
    assert result.stdout == ""


def test_strict_plugins_is_quiet_when_every_plugin_loads(plugins):
    plugins(_point("hello-plugin-rule", "HelloRule"))
    assert _cli("analyze", UNEVEN_BAD, "--strict-plugins").exit_code == 0
    assert _cli("rules", "--strict-plugins").exit_code == 0
    assert _cli("check", UNEVEN_BAD, "--strict-plugins", "--select", "hello-plugin-rule").exit_code == 0


# -- API versions -----------------------------------------------------------------------------

def test_incompatible_api_version_is_skipped_with_a_clear_message(plugins):
    plugins(_point("needs-api-two", "NeedsApi2", ("future-plugin", "3.1")), _point("bad-api-version", "BadApiVersion"),
            _point("hello-plugin-rule", "HelloRule"))
    registry = registry_module.discover()
    assert "needs-api-two" not in registry.ids() and "bad-api-version" not in registry.ids()
    assert "hello-plugin-rule" in registry.ids()
    messages = {e.entry_point.split(" ")[0]: e.message for e in registry.errors}
    assert messages["needs-api-two"].startswith(
        f"NeedsApi2 needs rule-plugin API '>=2.0', but hlo-doctor {__version__} provides API {API_VERSION}; ")
    assert "BadApiVersion.api_version is not a valid requirement" in messages["bad-api-version"]

    listing = _cli("rules")
    assert "needs-api-two" not in listing.stdout
    assert "(plugin future-plugin==3.1) not loaded: NeedsApi2 needs rule-plugin API '>=2.0'" in listing.stderr
    report = analyze_dump(UNEVEN_BAD)
    assert any("needs rule-plugin API '>=2.0'" in e.message for e in report.errors)
    assert _cli("analyze", UNEVEN_BAD, "--strict-plugins").exit_code == 2


@pytest.mark.parametrize("requirement, ok", [
    (None, True), ("1", True), ("1.0", True), ("1.1", True), ("1.2", True), (">=1.0,<2", True), ("~=1.0", True),
    ("==1.2", True), ("!=1.0", True), (">=1, <2", True), ("0", False), ("2", False), ("1.3", False),
    (">=2.0", False), ("<1", False), ("==1.1", False), ("!=1.2", False),
])
def test_api_version_requirements(requirement, ok):
    rule = type("R", (plugin_fakes.HelloRule,), {"api_version": requirement})
    assert (api_version_problem(rule) is None) is ok
    if requirement is not None:
        assert satisfies(requirement, API_VERSION) is ok


@pytest.mark.parametrize("requirement", ["", "one", ">=", "1.x", "~=1", "1,>=1", ">=1.0;<2"])
def test_malformed_api_version_requirements(requirement):
    with pytest.raises(ValueError):
        satisfies(requirement)


def test_api_version_compares_numerically():
    assert satisfies(">=1.2", "1.10") and not satisfies("<1.9", "1.10") and satisfies("1.2", "1.10")


# -- per-rule options of a plugin rule ----------------------------------------------------------

def test_plugin_rule_options_come_from_the_config_file(plugins, tmp_path):
    plugins(_point("option-plugin-rule", "OptionRule"))
    config = tmp_path / "hlo-doctor.toml"
    config.write_text('[rules.option-plugin-rule]\nthreshold = 5\ntags = ["a", "b"]\n')
    result = _cli("analyze", UNEVEN_BAD, "--config", config, "--select", "option-plugin-rule", "--format", "json")
    assert result.exit_code == 0, result.output
    (finding,) = json.loads(result.stdout)["findings"]
    assert "threshold=5 tags=a,b" in finding["message"]

    shown = _cli("config", "--config", config)
    assert re.search(r"^rules\.option-plugin-rule\.threshold +5 +\(.*hlo-doctor\.toml\)$", shown.stdout, re.MULTILINE)


@pytest.mark.parametrize("body, message", [
    ("nope = 1", "rules.option-plugin-rule: unknown option 'nope' (valid options: threshold, tags)"),
    ('threshold = "five"', "rules.option-plugin-rule.threshold must be int, not 'five'"),
    ("tags = [1]", "rules.option-plugin-rule.tags must be tuple[str, ...], not [1]"),
])
def test_bad_plugin_rule_options_are_errors(plugins, tmp_path, body, message):
    plugins(_point("option-plugin-rule", "OptionRule"))
    config = tmp_path / "pyproject.toml"
    config.write_text(f"[tool.hlo-doctor.rules.option-plugin-rule]\n{body}\n")
    for command in ("analyze", "check"):
        result = _cli(command, UNEVEN_BAD, "--config", config)
        assert result.exit_code == 2, result.output
        assert message in result.stderr


# -- the public modules ------------------------------------------------------------------------

def test_the_plugin_module_is_the_rule_authors_api():
    from hlo_doctor.rules.base import Finding, Rule, Severity, Suggestion
    from hlo_doctor.rules.context import RuleContext

    assert plugin.API_VERSION == API_VERSION == "1.2"
    assert plugin.GROUP == GROUP
    assert (plugin.Rule, plugin.RuleContext, plugin.Finding, plugin.Severity, plugin.Suggestion) == (
        Rule, RuleContext, Finding, Severity, Suggestion)
    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == [] and len(set(plugin.__all__)) == len(plugin.__all__)
    assert plugin.Rule.api_version is None  # built-in rules and older plugins: any version


def test_testing_helpers_accept_rule_classes_and_fail_on_extra_findings(tmp_path):
    # A rule class that is not installed is run by passing the class itself.
    result = assert_case(UNEVEN_BAD, rules=["uneven-sharding-padding"])
    assert result.ok and len(result.findings) == 1
    extra = run_case(UNEVEN_BAD, rules=[plugin_fakes.HelloRule])
    assert not extra.ok and extra.extra == [("hello-plugin-rule", None, None)] and extra.missing
    with pytest.raises(AssertionError, match="extra:   \\('hello-plugin-rule'"):
        assert_case(UNEVEN_BAD, rules=[plugin_fakes.HelloRule])
    with pytest.raises(FileNotFoundError):
        find_cases(tmp_path / "no-such-folder")
    bad = tmp_path / "case"
    bad.mkdir()
    (bad / "expected_findings.json").write_text('{"findings": [], "rule": ["x"]}')
    with pytest.raises(ValueError, match="unknown key 'rule'"):
        load_case(bad)


# -- the example plugin, when installed (CI installs it) ----------------------------------------

def test_one_pytest_run_covers_the_example_plugins_tests():
    from hlo_doctor.config import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert options["testpaths"] == ["tests", "examples/plugin/tests"]
    assert (ROOT / "examples" / "plugin" / "pyproject.toml").is_file()


def _example_version() -> str:
    try:
        return metadata.version(EXAMPLE_PLUGIN)
    except metadata.PackageNotFoundError:
        pytest.skip(f"the example plugin ({EXAMPLE_PLUGIN}) is not installed: pip install -e examples/plugin")


def test_rules_lists_the_installed_example_plugin_with_its_package_and_version():
    version = _example_version()
    listing = _cli("rules", "--strict-plugins")
    assert listing.exit_code == 0, listing.output
    (row,) = [line for line in listing.stdout.splitlines() if line.startswith("expert-weights-not-expert-sharded ")]
    assert f"plugin {EXAMPLE_PLUGIN}=={version}" in row and "warning" in row and "MoE expert weights" in row
    docs = _cli("rules", "expert-weights-not-expert-sharded")
    assert f"- **Origin:** plugin {EXAMPLE_PLUGIN}=={version}" in docs.stdout
    assert "## What it finds" in docs.stdout and "| `min-experts` | int | `2` |" in docs.stdout
    assert plugin.missing_sections(registry_module.discover().get("expert-weights-not-expert-sharded").rule) == []


def test_example_plugin_options_in_the_config_file(tmp_path):
    _example_version()
    bad = ROOT / "examples" / "plugin" / "tests" / "cases" / "moe" / "bad"
    config = tmp_path / "hlo-doctor.toml"
    rule = "expert-weights-not-expert-sharded"
    config.write_text(f'select = ["{rule}"]\n[rules.{rule}]\nexpert-axes = ["ep"]\n')
    quiet = _cli("analyze", bad, "--config", config, "--format", "json", "-v")
    assert quiet.exit_code == 0 and json.loads(quiet.stdout)["findings"] == []
    config.write_text(f'select = ["{rule}"]\n[rules.{rule}]\nmin-expert = 2\n')
    typo = _cli("analyze", bad, "--config", config)
    assert typo.exit_code == 2 and "unknown option 'min-expert' (valid options: expert-axes, min-experts)" in typo.stderr


def test_example_plugin_does_not_fire_on_hlo_doctors_own_fixtures():
    _example_version()
    for folder in find_cases(ROOT / "fixtures"):
        report = analyze_dump(folder, select=["expert-weights-not-expert-sharded"])
        assert report.findings == (), folder
