"""The configuration table (one, in docs/reference/configuration.md) is the code's and the
template's:
every variable the functions or archive-ctl read has a row, and each row's template
parameter, default and readers are what template.yaml and lib.platform.config do.

Who reads a variable is found, not listed: the lib.platform.config functions the archive
function's, the sweeper's and the auditor's cold start call (lib.archive.runtime,
lib.audit.runtime, and lib.platform.observability's module level), and those any module
of lib.cli calls, each run on an environment that records what is read. Variables only a
library reads (boto3, Powertools) are checked against the functions the template sets
them for."""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any

import pytest

from lib.platform import config
from lib.platform.errors import ConfigError
from tests.docs.log_texts import modules
from tests.docs.markdown import CONFIGURATION, every_doc, read
from tests.test_template import READ_BY_LIBRARIES, template

HEADER = "| variable | template parameter | default | used by | meaning |"
TABLE_DOC = CONFIGURATION
# What every reader needs to get past its required settings.
BASE = {
    "DATABASE_URL": "postgresql://u@127.0.0.1:5432/db",
    "LSKY_BASE_URL": "https://img.example.com",
    "LSKY_TOKEN": "1|abc",
    "ARCHIVE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
}
FUNCTIONS = {"archive": "ArchiveFunction", "sweeper": "SweeperFunction", "audit": "AuditFunction"}


class Recording(Mapping[str, str]):
    """An environment that remembers which names were looked up."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self.values[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self.values

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.values.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def _is_reader(name: str) -> bool:
    """A function of lib.platform.config itself that takes the environment."""
    function = getattr(config, name, None)
    return (
        inspect.isfunction(function)
        and function.__module__ == config.__name__
        and list(inspect.signature(function).parameters)[:1] == ["env"]
    )


def _config_calls(node: ast.AST) -> set[str]:
    """Names of lib.platform.config functions called under `node`."""
    names = set()
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        match call.func:
            case ast.Attribute(value=ast.Name(id="config"), attr=name):
                names.add(name)
            case ast.Name(id=name):
                names.add(name)
    return {name for name in names if _is_reader(name)}


@cache
def readers() -> dict[str, set[str]]:
    """Component -> the config functions its code calls."""
    found = modules()
    observability = _config_calls(found["lib.platform.observability"].tree)

    def body(module: str, name: str) -> set[str]:
        function = found[module].function(name)
        assert function is not None, f"{module}.{name} is gone"
        return _config_calls(function)

    cli = set().union(*(_config_calls(m.tree) for n, m in found.items() if n.startswith("lib.cli")))
    return {
        "archive": body("lib.archive.runtime", "archive_settings") | observability,
        "sweeper": body("lib.archive.runtime", "sweeper") | observability,
        "audit": body("lib.audit.runtime", "auditor") | observability,
        "CLI": cli,
    }


@cache
def reads() -> dict[str, set[str]]:
    """Component -> the variables its config functions read."""
    result = {}
    for component, functions in readers().items():
        names: set[str] = set()
        for name in functions:
            env = Recording(BASE)
            getattr(config, name)(env)
            names |= env.read
        result[component] = names
    return result


def template_env() -> dict[str, dict[str, Any]]:
    """Function -> its environment as template.yaml sets it (Globals included)."""
    t = template()
    common = t["Globals"]["Function"]["Environment"]["Variables"]
    return {
        short: {**common, **t["Resources"][name]["Properties"]["Environment"]["Variables"]}
        for short, name in FUNCTIONS.items()
    }


@cache
def table() -> dict[str, list[str]]:
    text = read(TABLE_DOC)
    lines = text.split("\n" + HEADER + "\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = {}
    for line in lines:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0].strip("`")] = cells
    return rows


def test_there_is_one_configuration_table() -> None:
    where = [
        doc
        for doc, text in every_doc().items()
        for line in text.splitlines()
        if line.lower().startswith("| variable |")
    ]
    assert where == [TABLE_DOC], "one configuration table; the others link to it"


def test_every_variable_read_has_a_row_and_every_row_is_read() -> None:
    read_by_code = set().union(*reads().values())
    set_by_template = set().union(*(env.keys() for env in template_env().values()))
    assert set(table()) == read_by_code | set_by_template


def used_by(cell: str) -> set[str]:
    words = {word.strip("`,") for word in cell.split()}
    found = set()
    if "all" in words:
        found |= {"archive", "sweeper", "audit"}
    if "both" in words:
        found |= {"archive", "sweeper"}
    found |= words & {"archive", "sweeper", "audit", "CLI"}
    assert found, cell
    return found


@pytest.mark.parametrize("variable", sorted(table()))
def test_the_row_names_who_reads_it(variable: str) -> None:
    claimed = used_by(table()[variable][3])
    if variable in READ_BY_LIBRARIES and not any(variable in r for r in reads().values()):
        # A library reads it wherever it runs: the functions the template sets it for.
        functions = {short for short, env in template_env().items() if variable in env}
        assert claimed - {"CLI"} == functions, (variable, claimed)
    else:
        actual = {component for component, names in reads().items() if variable in names}
        assert claimed == actual, (variable, claimed, actual)


def _with_conditions(value: Any) -> str:
    """The value as JSON, with the conditions an Fn::If names spelt out."""
    dumped = json.dumps(value)
    conditions = template().get("Conditions", {})
    for name in re.findall(r'"Fn::If": \["(\w+)"', dumped):
        dumped += json.dumps(conditions.get(name))
    return dumped


def _as_set_by_template(cell: str, value: Any) -> None:
    dumped = _with_conditions(value)
    if cell.startswith("fixed"):
        fixed = re.findall(r"`([^`]+)`", cell)[0]
        assert value == fixed, (cell, value)
    elif cell.startswith("–"):
        assert value == "", (cell, value)  # declared for sam local, empty when deployed
    else:
        for name in re.findall(r"`(\w+)`", cell):
            assert name in dumped, (cell, value)
        assert re.findall(r"`(\w+)`", cell), cell


@pytest.mark.parametrize("variable", sorted(table()))
def test_the_row_names_the_template_s_setting(variable: str) -> None:
    cell = table()[variable][1]
    values = [env[variable] for env in template_env().values() if variable in env]
    if not values:
        assert cell.startswith("–"), (variable, cell)
        assert "not set" in cell, (variable, cell)
        return
    for value in values:
        _as_set_by_template(cell, value)


def loaded(function: Callable[[Mapping[str, str]], Any], env: Mapping[str, str]) -> Any:
    try:
        return function(env)
    except ConfigError as error:
        return ("ConfigError", str(error))


@pytest.mark.parametrize("variable", sorted(table()))
def test_the_row_s_default_is_what_the_code_and_the_template_take_when_unset(
    variable: str,
) -> None:
    cell = table()[variable][2]
    parameter = re.fullmatch(r"`(\w+)`.*", table()[variable][1])
    stated = re.findall(r"`([^`]+)`", cell) or re.findall(r"^([\w./,]+)", cell)
    template_default = "(template)" in cell
    if parameter and parameter.group(1) in template()["Parameters"]:
        default = str(template()["Parameters"][parameter.group(1)].get("Default", ""))
        if cell.startswith(("–", "unset", "empty")):
            assert default == "", (variable, "template", default, cell)
        elif "(inverted)" in table()[variable][1]:
            inverted = {"true": "false", "false": "true"}[stated[0]]
            assert default == inverted, (variable, "template", default, cell)
        else:
            assert default == stated[0], (variable, "template", default, cell)
    if template_default:
        return  # the code's own default is said in words
    functions = [
        getattr(config, name)
        for component in ("archive", "sweeper", "CLI")
        for name in readers()[component]
        if variable in reads_of(name)
    ]
    unset = {k: v for k, v in BASE.items() if k != variable}
    for function in functions:
        if cell.startswith(("–", "unset", "empty")):
            # No default: unset is the same as empty, and either is refused or means off.
            assert loaded(function, {**unset, variable: ""}) == loaded(function, unset), variable
        else:
            assert stated, (variable, cell)
            same = loaded(function, {**unset, variable: stated[0]})
            assert loaded(function, unset) == same, (variable, function.__name__, stated[0])


@cache
def reads_of(name: str) -> frozenset[str]:
    env = Recording(BASE)
    getattr(config, name)(env)
    return frozenset(env.read)


def test_the_readers_are_found() -> None:
    """The scan sees the loaders the functions and archive-ctl call (guards the scan)."""
    assert {"load_settings", "service_name"} <= readers()["archive"]
    assert {"load_sweeper_settings", "tracing_enabled"} <= readers()["sweeper"]
    assert {"load_database_config", "pacing_limits", "queue_urls"} <= readers()["CLI"]
    assert "LSKY_RATE_LIMITS" in reads()["CLI"]
    assert "ARCHIVE_RETRY_DELAYS" not in reads()["sweeper"]
