"""The wiring in template.yaml that the design depends on.

cfn-lint and `sam validate` (make template-check) check that the template is valid
CloudFormation/SAM; these tests check that it is the *right* one: the numbers that
must agree with each other, the handler paths, the environment the code reads, the
IAM scope, and that env.json / events/ / samconfig.toml match the template.

Nothing here skips: a missing handler or a missing SAM CLI venv is a failure that
says what is missing.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from lib.platform.config import (
    FINISH_RESERVE_MS,
    load_audit_settings,
    load_settings,
    load_sweeper_settings,
)
from lib.platform.errors import ConfigError
from tests.logcapture import capture_logs, parse
from tests.support import run_python

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "template.yaml"
ENV_JSON = ROOT / "env.json"
SAMCONFIG = ROOT / "samconfig.toml"
SQS_EVENT = ROOT / "events" / "archive_sqs.json"
SCHEDULE_EVENT = ROOT / "events" / "sweeper_schedule.json"

FUNCTIONS = ("ArchiveFunction", "SweeperFunction", "AuditFunction")

# The environment contract (DESIGN.md) per function.
COMMON_ENV = {
    "DATABASE_URL",
    "DB_SECRET_ARN",
    "DB_SSLMODE",
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_LOG_LEVEL",
    "ARCHIVE_MAX_ATTEMPTS",
    "ARCHIVE_RETRY_DELAYS",
    "ARCHIVE_LOCK_TTL_SECONDS",
    "AWS_ENDPOINT_URL_SQS",
}
CONTRACT_ENV = {
    "ArchiveFunction": COMMON_ENV
    | {
        "LSKY_BASE_URL",
        "LSKY_TOKEN",
        "LSKY_TOKEN_SECRET_ARN",
        "LSKY_STRATEGY_ID",
        "LSKY_ALBUM_ID",
        "ARCHIVE_MAX_IMAGE_BYTES",
        "ARCHIVE_ALLOW_PRIVATE_NETWORKS",
        "ARCHIVE_DLQ_URL",
        "ARCHIVE_STAGING_BUCKET",
        "AWS_ENDPOINT_URL_S3",
    },
    "SweeperFunction": COMMON_ENV
    | {
        "ARCHIVE_QUEUE_URL",
        "ARCHIVE_SWEEP_GRACE_SECONDS",
        "ARCHIVE_REQUEUE_INTERVAL_SECONDS",
        "ARCHIVE_SWEEP_MAX_ROWS",
        "ARCHIVE_EVENT_RETENTION_DAYS",
    },
    "AuditFunction": COMMON_ENV
    | {
        "ARCHIVE_QUEUE_URL",
        "ARCHIVE_AUDIT_DAYS",
        "ARCHIVE_AUDIT_RATE",
        "ARCHIVE_EVENT_RETENTION_DAYS",
        "ARCHIVE_ORIGINALS_BUCKET",
        "ARCHIVE_ORIGINALS_STORAGE_CLASS",
        "ARCHIVE_MAX_IMAGE_BYTES",
        "ARCHIVE_ALLOW_PRIVATE_NETWORKS",
        "AWS_ENDPOINT_URL_S3",
    },
}
# Set by the template but read by libraries, not by our code.
READ_BY_LIBRARIES = {
    "POWERTOOLS_SERVICE_NAME",  # Powertools Logger/Metrics/Tracer
    "POWERTOOLS_METRICS_NAMESPACE",  # Powertools Metrics
    "POWERTOOLS_LOG_LEVEL",  # Powertools Logger
    "POWERTOOLS_TRACE_DISABLED",  # Powertools Tracer
    "AWS_ENDPOINT_URL_SQS",  # botocore
    "AWS_ENDPOINT_URL_S3",  # botocore
    "AWS_ENDPOINT_URL_EVENTBRIDGE",  # botocore
}
# Set by the Lambda runtime (or sam local), never by the template.
RUNTIME_ENV = {
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_EXECUTION_ENV",
    "AWS_SAM_LOCAL",
    "LAMBDA_TASK_ROOT",
    "LAMBDA_RUNTIME_DIR",
}
RUNTIME_ENV_PREFIXES = ("AWS_LAMBDA_",)

EMF_METRICS = {
    "Archived",
    "Retried",
    "Failed",
    "Duplicate",
    "Malformed",
    "ImageBytes",
    "ArchiveDuration",
    "Requeued",
    "SweepFailed",
    "OldestPendingAgeSeconds",
}


# ---------------------------------------------------------------- loading


class CfnLoader(yaml.SafeLoader):
    """A YAML loader that turns CloudFormation short tags into their long form."""


def _construct_tag(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "Condition":
        return {"Condition": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _construct_tag)


@cache
def template() -> dict[str, Any]:
    return yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)  # noqa: S506 - SafeLoader subclass


@cache
def env_json() -> dict[str, dict[str, str]]:
    return json.loads(ENV_JSON.read_text())


@cache
def samconfig() -> dict[str, Any]:
    return tomllib.loads(SAMCONFIG.read_text())


def resource(name: str) -> dict[str, Any]:
    resources = template()["Resources"]
    assert name in resources, f"template.yaml has no resource {name}"
    return resources[name]


def props(name: str) -> dict[str, Any]:
    return resource(name).get("Properties", {})


def parameter(name: str) -> dict[str, Any]:
    params = template()["Parameters"]
    assert name in params, f"template.yaml has no parameter {name}"
    return params[name]


def globals_function() -> dict[str, Any]:
    return template().get("Globals", {}).get("Function", {})


def function_property(function: str, key: str) -> Any:
    """A function property with the Globals fallback SAM applies."""
    own = props(function)
    return own[key] if key in own else globals_function().get(key)


def declared_env(function: str) -> dict[str, Any]:
    """The environment variables the template sets for a function (Globals merged in)."""
    merged = dict(globals_function().get("Environment", {}).get("Variables", {}))
    merged.update(props(function).get("Environment", {}).get("Variables", {}))
    return merged


def template_accepts(name: str, value: str) -> bool:
    """Whether CloudFormation takes `value` for parameter `name`: its type, AllowedValues,
    AllowedPattern (a whole-string match) and MinValue/MaxValue. The patterns keep to the
    syntax Java's regex (CloudFormation) and Python's `re` read alike."""
    param = parameter(name)
    if "AllowedValues" in param and value not in [str(v) for v in param["AllowedValues"]]:
        return False
    if param["Type"] == "Number":
        try:
            number_value = float(value)
        except ValueError:
            return False
        low, high = param.get("MinValue"), param.get("MaxValue")
        return (low is None or number_value >= float(low)) and (
            high is None or number_value <= float(high)
        )
    pattern = param.get("AllowedPattern")
    return pattern is None or re.fullmatch(pattern, value) is not None


def number(value: Any) -> int:
    """A literal, or a !Ref to a parameter, as its (default) integer value."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        param = parameter(value["Ref"])
        assert "Default" in param, f"parameter {value['Ref']} has no default"
        value = param["Default"]
    assert not isinstance(value, dict), f"expected a literal or a parameter, got {value}"
    return int(value)


def ref_of(value: Any) -> str:
    assert isinstance(value, dict), f"expected a !Ref, got {value!r}"
    assert set(value) == {"Ref"}, f"expected a !Ref, got {value!r}"
    return value["Ref"]


def overrides(env: str) -> dict[str, str]:
    """parameter_overrides of a samconfig environment, parsed the way the SAM CLI does."""
    raw = samconfig()[env]["deploy"]["parameters"].get("parameter_overrides", [])
    items = [raw] if isinstance(raw, str) else list(raw)
    parsed: dict[str, str] = {}
    for item in items:
        for token in shlex.split(item):
            key, sep, value = token.partition("=")
            assert sep, f"samconfig [{env}] parameter override without '=': {token!r}"
            parsed[key] = value
    return parsed


def samconfig_envs() -> list[str]:
    return [env for env in samconfig() if isinstance(samconfig()[env], dict)]


def effective_parameter(env: str, name: str) -> int:
    value = overrides(env).get(name, parameter(name).get("Default"))
    assert value is not None, f"samconfig [{env}] sets no {name} and it has no default"
    return int(value)


# ---------------------------------------------------------------- handlers and build


@pytest.mark.parametrize("function", FUNCTIONS)
def test_handler_path_imports_and_resolves(function: str) -> None:
    code_uri = function_property(function, "CodeUri")
    handler = function_property(function, "Handler")
    assert code_uri == "src/", f"{function}: CodeUri must be src/ (DESIGN.md), got {code_uri!r}"
    module, _, attribute = handler.rpartition(".")
    path = ROOT / code_uri / Path(*module.split("."))
    assert path.with_suffix(".py").is_file(), (
        f"{function}: Handler {handler} needs {path.with_suffix('.py').relative_to(ROOT)}, "
        "which does not exist (yet): the handler code has not landed on this branch"
    )
    # Import it the way Lambda does: a fresh interpreter with CodeUri on sys.path and the
    # function's local environment (env.json), so module-level code runs for real.
    env = {**os.environ, **env_json()[function]}
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["PYTHONPATH"] = str(ROOT / code_uri)
    probe = (
        "import importlib, sys\n"
        f"handler = getattr(importlib.import_module({module!r}), {attribute!r}, None)\n"
        "sys.exit(0 if callable(handler) else 3)\n"
    )
    result = run_python("-c", probe, env=env)
    assert result.returncode != 3, f"{function}: {module} has no callable {attribute}"
    assert result.returncode == 0, f"{function}: importing {module} failed:\n{result.stderr}"


def test_runtime_and_architecture_match_the_build() -> None:
    runtime = globals_function().get("Runtime")
    assert re.fullmatch(r"python3\.\d+", runtime or ""), runtime
    makefile = (ROOT / "mk" / "lambda" / "Makefile").read_text()
    version = re.search(r"^LAMBDA_PYTHON_VERSION\s*:?=\s*(\S+)", makefile, re.M)
    platform = re.search(r"^LAMBDA_PLATFORM\s*:?=\s*(\S+)", makefile, re.M)
    assert version, "mk/lambda/Makefile sets no LAMBDA_PYTHON_VERSION"
    assert platform, "mk/lambda/Makefile sets no LAMBDA_PLATFORM"
    assert runtime == f"python{version.group(1)}", "Runtime and the wheels' Python version differ"
    for function in FUNCTIONS:
        assert function_property(function, "Runtime") == runtime
        assert function_property(function, "Architectures") == ["arm64"], function
        metadata = resource(function).get("Metadata", {})
        assert metadata.get("BuildMethod") == "makefile", function
        context = ROOT / metadata.get("ContextPath", function_property(function, "CodeUri"))
        assert (context / "Makefile").is_file(), f"{function}: no Makefile in {context}"
        targets = (context / "Makefile").read_text()
        assert re.search(rf"^[^#\n]*\bbuild-{function}\b[^\n]*:", targets, re.M), (
            f"{context / 'Makefile'} has no build-{function} target"
        )
    assert platform.group(1) == "manylinux2014_aarch64", "arm64 needs aarch64 wheels"


# ---------------------------------------------------------------- queue and timing


def test_queue_encryption_and_redrive() -> None:
    queue, dlq = props("ArchiveQueue"), props("ArchiveDLQ")
    assert resource("ArchiveQueue")["Type"] == "AWS::SQS::Queue"
    assert "FifoQueue" not in queue, "ArchiveQueue must be a standard queue"
    for name, queue_props in (("ArchiveQueue", queue), ("ArchiveDLQ", dlq)):
        assert queue_props.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in queue_props, (
            f"{name}: SSE is off"
        )
    redrive = queue["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": ["ArchiveDLQ", "Arn"]}
    assert ref_of(redrive["maxReceiveCount"]) == "MaxReceiveCount"
    assert parameter("MaxReceiveCount")["Default"] == 5

    assert dlq["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert dlq["MessageRetentionPeriod"] > queue.get("MessageRetentionPeriod", 4 * 24 * 3600), (
        "the DLQ keeps the original enqueue time, so it needs the longer retention"
    )
    allow = dlq["RedriveAllowPolicy"]
    assert allow["redrivePermission"] == "byQueue"
    # The source ARN is built with !Sub from the queue's fixed name (a !GetAtt would be
    # circular): both must spell the same name.
    queue_name = queue["QueueName"]["Fn::Sub"]
    (source,) = allow["sourceQueueArns"]
    assert source["Fn::Sub"].endswith(f":{queue_name}"), (source, queue_name)


def test_visibility_timeout_is_at_least_six_function_timeouts() -> None:
    timeout = number(props("ArchiveFunction")["Timeout"])
    visibility = number(props("ArchiveQueue")["VisibilityTimeout"])
    assert timeout == 120
    assert visibility >= 6 * timeout, (visibility, timeout)


def test_lock_ttl_is_between_function_timeout_and_visibility_timeout() -> None:
    timeout = number(props("ArchiveFunction")["Timeout"])
    visibility = number(props("ArchiveQueue")["VisibilityTimeout"])
    for function in FUNCTIONS:
        ttl = number(declared_env(function)["ARCHIVE_LOCK_TTL_SECONDS"])
        assert timeout < ttl < visibility, (function, timeout, ttl, visibility)


def test_the_functions_are_told_the_archive_function_timeout() -> None:
    timeout = number(props("ArchiveFunction")["Timeout"])
    for function in FUNCTIONS:
        env = declared_env(function)
        assert number(env["ARCHIVE_FUNCTION_TIMEOUT_SECONDS"]) == timeout, function
        # What lib.platform.config warns about at start: the lock outlives an attempt.
        ttl = number(env["ARCHIVE_LOCK_TTL_SECONDS"])
        assert ttl > timeout + FINISH_RESERVE_MS / 1000, (function, ttl, timeout)


def test_max_receive_count_exceeds_max_attempts_for_every_allowed_value() -> None:
    receive, attempts = parameter("MaxReceiveCount"), parameter("ArchiveMaxAttempts")
    assert int(receive["Default"]) > int(attempts["Default"])
    # CloudFormation cannot compare two parameters, so the ranges keep it true.
    most_attempts = max(n for n in range(1, 1001) if template_accepts("ArchiveMaxAttempts", str(n)))
    assert int(receive["MinValue"]) > most_attempts, (
        "some allowed ArchiveMaxAttempts is not below some allowed MaxReceiveCount"
    )
    assert int(receive["MinValue"]) >= 5, "AWS advises maxReceiveCount >= 5 for Lambda"
    for function in FUNCTIONS:
        assert ref_of(declared_env(function)["ARCHIVE_MAX_ATTEMPTS"]) == "ArchiveMaxAttempts"
    for env in samconfig_envs():
        if "deploy" in samconfig()[env]:
            assert effective_parameter(env, "MaxReceiveCount") > effective_parameter(
                env, "ArchiveMaxAttempts"
            ), env


def test_sqs_event_source() -> None:
    events = props("ArchiveFunction")["Events"]
    (sqs,) = [event for event in events.values() if event["Type"] == "SQS"]
    source = sqs["Properties"]
    assert source["Queue"] == {"Fn::GetAtt": ["ArchiveQueue", "Arn"]}
    assert source["BatchSize"] == 1
    assert source["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert "FilterCriteria" not in source, "a filter would delete messages unseen"


def test_maximum_concurrency_equals_reserved_concurrency() -> None:
    function = props("ArchiveFunction")
    (sqs,) = [event for event in function["Events"].values() if event["Type"] == "SQS"]
    maximum = sqs["Properties"]["ScalingConfig"]["MaximumConcurrency"]
    reserved = function["ReservedConcurrentExecutions"]
    assert ref_of(maximum) == ref_of(reserved) == "ArchiveConcurrency"
    concurrency = parameter("ArchiveConcurrency")
    assert concurrency["Default"] == 2
    # AWS rejects MaximumConcurrency below 2; neither cfn-lint nor sam validate does.
    assert int(concurrency["MinValue"]) >= 2
    assert int(concurrency["MaxValue"]) <= 1000
    for env in samconfig_envs():
        if "deploy" in samconfig()[env]:
            assert effective_parameter(env, "ArchiveConcurrency") >= 2, env


def test_sweeper_schedule_and_concurrency() -> None:
    sweeper = props("SweeperFunction")
    assert sweeper["ReservedConcurrentExecutions"] == 1
    assert number(sweeper["Timeout"]) == 60
    assert number(sweeper["MemorySize"]) == 256
    (schedule,) = [e for e in sweeper["Events"].values() if e["Type"] in ("ScheduleV2", "Schedule")]
    expression = schedule["Properties"]["ScheduleExpression"]
    assert parameter(ref_of(expression))["Default"] == "rate(5 minutes)"
    archive = props("ArchiveFunction")
    assert number(archive["MemorySize"]) == 512


def test_the_audit_runs_alone_on_its_own_schedule_and_can_only_send_restores() -> None:
    audit = props("AuditFunction")
    assert audit["Handler"] == "handlers.auditor.lambda_handler"
    assert audit["CodeUri"] == "src/"
    assert audit["ReservedConcurrentExecutions"] == 1
    (schedule,) = [e for e in audit["Events"].values() if e["Type"] == "ScheduleV2"]
    expression = schedule["Properties"]["ScheduleExpression"]
    assert parameter(ref_of(expression))["Default"] == "rate(15 minutes)"
    assert parameter("AuditDays")["Default"] == "30"
    grants = _grants("AuditFunctionRole")
    assert grants["sqs:SendMessage"] == [{"Fn::GetAtt": ["ArchiveQueue", "Arn"]}]
    assert "sqs:ReceiveMessage" not in grants
    assert grants["logs:PutLogEvents"] == [{"Fn::GetAtt": ["AuditLogGroup", "Arn"]}]
    # The alarms an operator is told about (docs/how-to/runbook.md).
    alarms = ("AuditMissingAlarm", "AuditAlteredAlarm", "LostOnHostAlarm", "AuditHostDownAlarm")
    for alarm in alarms:
        assert resource(alarm)["Type"] == "AWS::CloudWatch::Alarm"


def test_sweeper_schedule_input_matches_the_event_file() -> None:
    """What Scheduler sends (context attributes filled in) has the event file's shape."""
    (schedule,) = [
        e for e in props("SweeperFunction")["Events"].values() if e["Type"] == "ScheduleV2"
    ]
    raw = schedule["Properties"]["Input"]
    text = raw["Fn::Sub"] if isinstance(raw, dict) else raw
    text = re.sub(r"\$\{[^}]+\}", "x", text)
    text = re.sub(r"<aws\.scheduler\.[a-z-]+>", "x", text)
    sent = json.loads(text)
    event = json.loads(SCHEDULE_EVENT.read_text())
    assert set(sent) == set(event)
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == sent["source"]


# ---------------------------------------------------------------- environment


ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
ENV_MAPPINGS = {"environ", "env"}  # os.environ, and mappings passed around as `env`


def _is_env_mapping(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id in ENV_MAPPINGS
    )


def env_reads(source: str) -> set[str]:
    """Environment variable names a module reads.

    os.environ[NAME], os.environ.get/pop/setdefault(NAME), os.getenv(NAME), NAME in
    os.environ, the same on a mapping called `env`, helper calls that take the mapping
    and names (`positive_int(env, "NAME", 3)`), and a name defaulted in a function that
    takes `env` (`def delays(env, name="NAME")`). NAME is a string literal or a
    module-level string constant.
    """
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }

    def literal(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str | None] = []
        if isinstance(node, ast.Subscript) and _is_env_mapping(node.value):
            names.append(literal(node.slice))
        elif isinstance(node, ast.Compare) and any(_is_env_mapping(c) for c in node.comparators):
            names.append(literal(node.left))
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("get", "pop", "setdefault")
                and _is_env_mapping(func.value)
            ) or (
                (isinstance(func, ast.Attribute) and func.attr == "getenv")
                or (isinstance(func, ast.Name) and func.id == "getenv")
            ):
                names.append(literal(node.args[0]) if node.args else None)
            elif any(_is_env_mapping(arg) for arg in node.args) or any(
                _is_env_mapping(kw.value) for kw in node.keywords
            ):
                names.extend(literal(arg) for arg in node.args)
                names.extend(literal(kw.value) for kw in node.keywords)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            if any(arg.arg in ENV_MAPPINGS for arg in arguments.args + arguments.kwonlyargs):
                names.extend(literal(default) for default in arguments.defaults)
                names.extend(literal(default) for default in arguments.kw_defaults if default)
        found.update(name for name in names if name and ENV_NAME.fullmatch(name))
    return found


def code_env_reads() -> dict[str, set[Path]]:
    sources = sorted((ROOT / "src").rglob("*.py"))
    handlers = [path for path in sources if path.parent.name == "handlers"]
    assert any(path.name != "__init__.py" for path in handlers), (
        "src/handlers/ has no handler modules yet: the application code has not landed on "
        "this branch, so the environment it reads cannot be checked"
    )
    reads: dict[str, set[Path]] = {}
    for path in sources:
        for name in env_reads(path.read_text()):
            reads.setdefault(name, set()).add(path.relative_to(ROOT))
    return reads


def _is_runtime_env(name: str) -> bool:
    return name in RUNTIME_ENV or name.startswith(RUNTIME_ENV_PREFIXES)


def test_env_scanner_finds_every_access_form() -> None:
    sample = (
        "import os\n"
        "TRACE = 'POWERTOOLS_TRACE_DISABLED'\n"
        "a = os.environ['DATABASE_URL']\n"
        "b = os.environ.get('DB_SSLMODE', 'x')\n"
        "c = os.getenv('LSKY_TOKEN')\n"
        "d = 'LSKY_ALBUM_ID' in os.environ\n"
        "e = os.environ.get(TRACE)\n"
        "def f(env, name='ARCHIVE_RETRY_DELAYS'):\n"
        "    return positive_int(env, 'ARCHIVE_MAX_ATTEMPTS', 3), env.get('ARCHIVE_DLQ_URL')\n"
        "g = require_one_of(os.environ, 'LSKY_TOKEN', 'LSKY_TOKEN_SECRET_ARN')\n"
        "h = {'NOT_AN_ENV_READ': 1}['NOT_AN_ENV_READ']\n"
    )
    assert env_reads(sample) == {
        "DATABASE_URL",
        "DB_SSLMODE",
        "LSKY_TOKEN",
        "LSKY_ALBUM_ID",
        "POWERTOOLS_TRACE_DISABLED",
        "ARCHIVE_RETRY_DELAYS",
        "ARCHIVE_MAX_ATTEMPTS",
        "ARCHIVE_DLQ_URL",
        "LSKY_TOKEN_SECRET_ARN",
    }


def test_every_environment_variable_the_code_reads_is_set_by_the_template() -> None:
    reads = code_env_reads()
    declared = set().union(*(declared_env(function) for function in FUNCTIONS))
    missing = {
        name: sorted(map(str, paths))
        for name, paths in reads.items()
        if name not in declared and not _is_runtime_env(name)
    }
    assert not missing, f"read by the code but not set in template.yaml: {missing}"


def test_every_template_variable_is_read_by_someone() -> None:
    """Catches a typo or a rename: a variable nobody reads is configuration that is lost."""
    reads = set(code_env_reads())
    for function in FUNCTIONS:
        unread = set(declared_env(function)) - reads - READ_BY_LIBRARIES
        assert not unread, f"{function} sets variables no code reads: {sorted(unread)}"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_gets_its_contract_environment(function: str) -> None:
    declared = declared_env(function)
    missing = CONTRACT_ENV[function] - set(declared)
    assert not missing, f"{function} lacks {sorted(missing)}"
    assert declared["POWERTOOLS_METRICS_NAMESPACE"] == "ImageArchive"
    # Values only sam local/tests provide are declared empty, never given a value.
    for name in (
        "DATABASE_URL",
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL_EVENTBRIDGE",
        "LSKY_TOKEN",
    ):
        if name in declared:
            assert declared[name] == "", f"{function}: {name} must be empty in the template"
    # Optional values are plain parameters whose default is empty (the code treats empty
    # as unset) and whose secret-read permission is conditional.
    for name, param in (
        ("DB_SECRET_ARN", "DbSecretArn"),
        ("DB_SSL_ROOT_CERT", "DbSslRootCert"),
        ("LSKY_TOKEN_SECRET_ARN", "LskyTokenSecretArn"),
        ("LSKY_STRATEGY_ID", "LskyStrategyId"),
        ("LSKY_ALBUM_ID", "LskyAlbumId"),
    ):
        if name in declared:
            assert ref_of(declared[name]) == param
            assert parameter(param)["Default"] == ""


def test_sweeper_defaults() -> None:
    env = declared_env("SweeperFunction")
    assert number(env["ARCHIVE_SWEEP_GRACE_SECONDS"]) == 300
    assert number(env["ARCHIVE_REQUEUE_INTERVAL_SECONDS"]) == 900
    assert number(env["ARCHIVE_SWEEP_MAX_ROWS"]) == 5000
    assert env["ARCHIVE_QUEUE_URL"] == {"Ref": "ArchiveQueue"}
    assert declared_env("ArchiveFunction")["ARCHIVE_DLQ_URL"] == {"Ref": "ArchiveDLQ"}


# ---------------------------------------------------------------- settings, checked where set


@dataclass(frozen=True)
class Setting:
    """A template parameter, the variable it sets, and values with their verdict: True
    when both the template and lib.platform.config accept the value as it is."""

    parameter: str
    variable: str
    load: Callable[[dict[str, str]], object]
    values: dict[str, bool]
    # Accepted by the pattern, which cannot spell the whole rule, but stopped at cold start
    # by a ConfigError naming the variable: loud, never a fallback.
    loud: tuple[str, ...] = ()
    # Refused by the template only, with the reason the code cannot see.
    template_only: tuple[str, ...] = ()
    why_template_only: str = ""


# Empty is "unset" to the code (its default); the template wants the number written out.
EMPTY_IS_THE_DEFAULT = "empty means the default to the code; the template wants it written"
SETTINGS = (
    Setting(
        "LskyBaseUrl",
        "LSKY_BASE_URL",
        load_settings,
        {
            "https://img.example.com": True,
            "http://127.0.0.1:8080": True,
            "https://img.example.com/lsky/": True,
            "img.example.com": False,
            "https://": False,
            "ftp://img.example.com": False,
            "https://img example.com": False,
            "": False,  # required
        },
    ),
    Setting(
        "LskyStrategyId",
        "LSKY_STRATEGY_ID",
        load_settings,
        {
            "": True,
            "1": True,
            "999999999999999999": True,
            "0": False,
            "-1": False,
            "007": False,
            "1.5": False,
            "two": False,
            "9999999999999999999": False,  # 19 digits: past a BIGINT
        },
    ),
    Setting(
        "LskyAlbumId",
        "LSKY_ALBUM_ID",
        load_settings,
        {"": True, "7": True, "0": False, "+7": False, "\u0663": False},
    ),
    Setting(
        "LskyRateLimits",
        "LSKY_RATE_LIMITS",
        load_settings,
        {
            "": True,
            "20/minute,100/hour": True,
            "20/minute, 100/hour": True,  # README's spelling
            "10/30 seconds": True,  # README's spelling
            "5/seconds": True,
            "999999/day": True,
            "1/month": True,
            "10/31 days": True,
            "10/4 weeks": True,
            "10/744 hours": True,
            "10/44640 minutes": True,
            "10/2678400 seconds": True,
            "20/fortnight": False,
            "0/minute": False,
            "020/minute": False,
            "20/0 seconds": False,
            "20/minute,": False,
            ",": False,
            "20 per minute": False,
            "20/Minute": False,
            "10/32 days": False,  # windows over 31 days
            "10/5 weeks": False,
            "10/2 months": False,
            "10/745 hours": False,
            "10/44641 minutes": False,
            "10/2678401 seconds": False,
            "1000000/hour": False,  # an absurd count
        },
    ),
    Setting(
        "DbSslMode",
        "DB_SSLMODE",
        load_settings,
        {"require": True, "verify-full": True, "disable": True, "REQUIRE": False, "on": False},
    ),
    Setting(
        "ArchiveMaxAttempts",
        "ARCHIVE_MAX_ATTEMPTS",
        load_sweeper_settings,
        {
            "1": True,
            "4": True,
            "0": False,
            "-1": False,
            "three": False,
            "1.5": False,
            "03": False,
        },
        template_only=("5", "40", ""),
        why_template_only="MaxReceiveCount (at least 5) must stay above it; "
        + EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "ArchiveRetryDelays",
        "ARCHIVE_RETRY_DELAYS",
        load_settings,
        {
            "30,120,600": True,
            "10, 20,40": True,
            "1": True,
            "43200": True,
            "1,43200": True,
            "0": False,
            "43201": False,
            "99999": False,  # issue 19: the template took it, the code fell back
            "30,,60": False,
            "30,abc": False,
            "30,0": False,
            "-30": False,
            "30.5": False,
        },
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "ArchiveMaxRetryAfterSeconds",
        "ARCHIVE_MAX_RETRY_AFTER_SECONDS",
        load_settings,
        {"1": True, "3600": True, "43200": True, "0": False, "43201": False, "1h": False},
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "OriginalsStorageClass",
        "ARCHIVE_ORIGINALS_STORAGE_CLASS",
        load_settings,
        {
            "GLACIER_IR": True,
            "STANDARD": True,
            "STANDARD_IA": True,
            "INTELLIGENT_TIERING": True,
            "GLACIER": False,
            "DEEP_ARCHIVE": False,
            "glacier_ir": False,
        },
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "LskyTimezone",
        "LSKY_TIMEZONE",
        load_settings,
        {
            "Asia/Shanghai": True,
            "UTC": True,
            "America/Argentina/Buenos_Aires": True,
            "Etc/GMT+8": True,
            "PRC": True,
            "../etc": False,
        },
        loud=("Asia/Nowhere",),
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "ArchiveMaxImageBytes",
        "ARCHIVE_MAX_IMAGE_BYTES",
        load_settings,
        {
            "1": True,
            "52428800": True,
            "500000000": True,
            "0": False,
            "500000001": False,
            "10000000000": False,
            "50MB": False,
            "1e6": False,  # a Number parameter would have taken these two
            "1.5": False,
        },
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "ArchiveAllowPrivateNetworks",
        "ARCHIVE_ALLOW_PRIVATE_NETWORKS",
        load_settings,
        {
            "": True,
            "127.0.0.0/8": True,
            "127.0.0.0/8,10.0.0.0/8": True,
            "127.0.0.0/8, ::1/128": True,
            "10.1.2.3": True,
            "fd00::/8": True,
            "10.0.0.300/8": False,
            "10.0.0.0/33": False,
            "10.0.0.0/08": False,
            "localhost": False,
            "127.0.0.0/8,": False,
            "::g/64": False,
            "fe80::/129": False,
        },
        loud=(":::/64", "1:2:3:4:5:6:7:8:9/64"),
    ),
    Setting(
        "SweepGraceSeconds",
        "ARCHIVE_SWEEP_GRACE_SECONDS",
        load_sweeper_settings,
        {"1": True, "300": True, "86400": True, "0": False, "86401": False, "5m": False},
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "RequeueIntervalSeconds",
        "ARCHIVE_REQUEUE_INTERVAL_SECONDS",
        load_sweeper_settings,
        {"1": True, "900": True, "86400": True, "0": False, "999999": False, "-900": False},
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "SweepMaxRows",
        "ARCHIVE_SWEEP_MAX_ROWS",
        load_sweeper_settings,
        {"1": True, "5000": True, "1000000": True, "0": False, "1000001": False, "1e6": False},
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "EventRetentionDays",
        "ARCHIVE_EVENT_RETENTION_DAYS",
        load_sweeper_settings,
        {
            "1": True,
            "30": True,
            "365": True,
            "3599": True,
            "3650": True,
            "0": False,
            "3651": False,
            "030": False,
            "-30": False,
            "30d": False,
        },
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "AuditDays",
        "ARCHIVE_AUDIT_DAYS",
        load_audit_settings,
        {"1": True, "30": True, "3650": True, "0": False, "3651": False, "30d": False, "-1": False},
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
    Setting(
        "AuditRate",
        "ARCHIVE_AUDIT_RATE",
        load_audit_settings,
        {
            "5": True,
            "0.5": True,
            "0.001": True,
            "12.25": True,
            "1000": True,
            "0": False,
            "0.0": False,
            "0.0001": False,
            "1001": False,
            "-1": False,
            "5.": False,
            "1e3": False,
        },
        template_only=("",),
        why_template_only=EMPTY_IS_THE_DEFAULT,
    ),
)
# Parameters whose variable the code takes as given: the template's check is the only one.
PASSED_THROUGH = {
    "DbSecretArn": "a Secrets Manager id; a wrong one fails the first fetch, naming it",
    "LskyTokenSecretArn": "likewise",
    "DbSslRootCert": "a file in the package: a missing one is a ConfigError at start",
    "ServiceName": "Powertools' service name",
    "LogLevel": "Powertools' log level",
}
# Valid for both loaders, so that each verdict is about the one variable under test.
SETTINGS_BASE = {
    "DATABASE_URL": "postgresql://u@127.0.0.1:5432/db",
    "LSKY_BASE_URL": "https://img.example.com",
    "LSKY_TOKEN": "1|abc",
    "ARCHIVE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
}


def config_verdict(setting: Setting, value: str) -> str:
    """ "ok", "fallback" (a warning naming the variable) or "error" (a ConfigError naming
    it): what the function does at cold start with the variable set to `value`."""
    refused: ConfigError | None = None
    with capture_logs() as raw:
        try:
            setting.load({**SETTINGS_BASE, setting.variable: value})
        except ConfigError as error:
            refused = error
    if refused is not None:
        assert setting.variable in str(refused), refused
        return "error"
    warned = [
        line
        for line in parse(raw)
        if line["level"] == "WARNING" and setting.variable in str(line["message"])
    ]
    return "fallback" if warned else "ok"


def test_every_setting_is_refused_by_the_template_exactly_when_the_code_refuses_it() -> None:
    """Issue 19: a value the code refuses (or falls back on) must not deploy, and a value
    the template lets through must work as written. Values are compared as CloudFormation
    passes them; the code also trims surrounding whitespace, which the template refuses."""
    setting_env = {
        ref_of(value): name
        for function in FUNCTIONS
        for name, value in declared_env(function).items()
        if isinstance(value, dict)
        and set(value) == {"Ref"}
        and value["Ref"] in template()["Parameters"]
    }
    covered = {setting.parameter for setting in SETTINGS}
    assert covered | set(PASSED_THROUGH) == set(setting_env), "a parameter without a row"
    disagreements = []
    for setting in SETTINGS:
        assert setting_env[setting.parameter] == setting.variable
        assert any(setting.values.values()), setting.parameter
        assert not all(setting.values.values()), setting.parameter
        for value, accepted in setting.values.items():
            template_ok = template_accepts(setting.parameter, value)
            code = config_verdict(setting, value)
            if template_ok != accepted or (code == "ok") != accepted:
                disagreements.append((setting.parameter, value, accepted, template_ok, code))
        for value in setting.loud:
            template_ok = template_accepts(setting.parameter, value)
            code = config_verdict(setting, value)
            if not template_ok or code != "error":
                disagreements.append((setting.parameter, value, "loud", template_ok, code))
        for value in setting.template_only:
            assert setting.why_template_only
            template_ok = template_accepts(setting.parameter, value)
            code = config_verdict(setting, value)
            if template_ok or code != "ok":
                disagreements.append((setting.parameter, value, "template only", template_ok, code))
    assert not disagreements, "(parameter, value, expected, template accepts, code):\n" + "\n".join(
        map(repr, disagreements)
    )


# ---------------------------------------------------------------- local files


@pytest.mark.parametrize("function", FUNCTIONS)
def test_env_json_sets_exactly_the_declared_variables(function: str) -> None:
    """sam local invoke ignores env.json keys the template does not declare."""
    local = env_json()[function]
    assert all(isinstance(value, str) for value in local.values()), "env.json values are strings"
    assert set(local) == set(declared_env(function)), {
        "ignored by sam local": sorted(set(local) - set(declared_env(function))),
        "not set locally": sorted(set(declared_env(function)) - set(local)),
    }


def test_env_json_points_at_local_test_services() -> None:
    stack = samconfig()["default"]["global"]["parameters"]["stack_name"]
    archive, sweeper = env_json()["ArchiveFunction"], env_json()["SweeperFunction"]
    for local in (archive, sweeper):
        assert local["DATABASE_URL"].startswith("postgresql://")
        assert "@127.0.0.1:" in local["DATABASE_URL"]
        assert local["DB_SECRET_ARN"] == ""
        assert local["AWS_ENDPOINT_URL_SQS"].startswith("http://127.0.0.1:")
    assert archive["LSKY_BASE_URL"].startswith("http://127.0.0.1:")
    assert archive["LSKY_TOKEN"]
    assert archive["LSKY_TOKEN_SECRET_ARN"] == ""
    assert archive["ARCHIVE_ALLOW_PRIVATE_NETWORKS"] == "127.0.0.0/8"
    endpoint = archive["AWS_ENDPOINT_URL_SQS"]
    assert archive["ARCHIVE_DLQ_URL"] == f"{endpoint}/123456789012/{stack}-dlq"
    # One moto server serves every AWS service on one port (devkit.sqs.start_moto_server).
    assert archive["AWS_ENDPOINT_URL_S3"] == endpoint
    assert archive["ARCHIVE_STAGING_BUCKET"] == f"{stack}-staging"
    for local in (archive, sweeper):
        assert local["AWS_ENDPOINT_URL_EVENTBRIDGE"] == local["AWS_ENDPOINT_URL_SQS"]
    endpoint = sweeper["AWS_ENDPOINT_URL_SQS"]
    assert sweeper["ARCHIVE_QUEUE_URL"] == f"{endpoint}/123456789012/{stack}-queue"


def test_sqs_event_is_a_realistic_receive() -> None:
    stack = samconfig()["default"]["global"]["parameters"]["stack_name"]
    (record,) = json.loads(SQS_EVENT.read_text())["Records"]
    assert record["eventSource"] == "aws:sqs"
    body = json.loads(record["body"])
    assert re.fullmatch(r"[1-9][0-9]*", str(body["recordId"]))
    assert record["md5OfBody"] == hashlib.md5(record["body"].encode()).hexdigest()  # noqa: S324
    attributes = record["attributes"]
    for key in ("ApproximateReceiveCount", "SentTimestamp", "ApproximateFirstReceiveTimestamp"):
        assert isinstance(attributes[key], str), key
        assert attributes[key].isdigit(), key
    assert attributes["SenderId"]
    _, _, service, region, account, name = record["eventSourceARN"].split(":")
    assert (service, account, name) == ("sqs", "123456789012", f"{stack}-queue")
    assert record["awsRegion"] == region
    # The queue URL the handler derives from this ARN is the one env.json's endpoint serves.
    dlq_url = env_json()["ArchiveFunction"]["ARCHIVE_DLQ_URL"]
    assert dlq_url.rsplit("/", 2)[1] == account


def test_samconfig_environments() -> None:
    config = samconfig()
    assert config["version"] == 0.1
    assert "prod" in config, "samconfig.toml has no prod environment example"
    known = set(template()["Parameters"])
    for env in ("default", "prod"):
        stack = config[env].get("global", {}).get("parameters", {}).get("stack_name")
        assert stack, f"[{env}] has no stack_name"
        deploy = config[env]["deploy"]["parameters"]
        assert "CAPABILITY_IAM" in deploy["capabilities"]
        assert deploy["confirm_changeset"] is True
        assert deploy["resolve_s3"] is True
        unknown = set(overrides(env)) - known
        assert not unknown, f"[{env}] overrides unknown parameters {sorted(unknown)}"
    assert config["default"]["local_invoke"]["parameters"]["env_vars"] == "env.json"
    # `lint = true` would make plain `sam validate` skip SAM's own validation.
    assert not config["default"].get("validate", {}).get("parameters", {}).get("lint")
    prod = overrides("prod")
    for name, param in template()["Parameters"].items():
        if name in prod and "AllowedPattern" in param and param.get("Type") == "String":
            assert re.fullmatch(param["AllowedPattern"], prod[name]), (name, prod[name])


# ---------------------------------------------------------------- IAM


SAM_PYTHON_HELP = (
    "the IAM checks translate the template with aws-sam-translator, which lives in the SAM "
    "CLI's venv: create it (python -m venv .venv-sam && .venv-sam/bin/pip install -r "
    "requirements-sam.txt) or point SAM at its sam executable"
)

TRANSLATE = r"""
import json, sys
from samtranslator.translator.transform import transform

class NoManagedPolicies:
    def load(self):
        return {}

template = json.load(sys.stdin)
parameters = json.loads(sys.argv[1])
print(json.dumps(transform(template, parameters, NoManagedPolicies())))
"""


@cache
def translated() -> dict[str, Any]:
    """template.yaml as CloudFormation, translated offline with every optional feature on."""
    sam_template = json.loads(json.dumps(template()))
    for function in FUNCTIONS:
        sam_template["Resources"][function]["Properties"]["CodeUri"] = f"s3://bucket/{function}.zip"
    parameters = {
        "LskyBaseUrl": "https://img.example.com",
        "DbSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf",
        "LskyTokenSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:tok-AbCdEf",
    }
    sam = Path(os.environ.get("SAM", ROOT / ".venv-sam" / "bin" / "sam"))
    if not sam.is_absolute():
        sam = ROOT / sam
    python = sam.parent / "python"
    assert python.exists(), f"{python} not found: {SAM_PYTHON_HELP}"
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    result = subprocess.run(
        [str(python), "-c", TRANSLATE, json.dumps(parameters)],
        input=json.dumps(sam_template),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"translation failed:\n{result.stderr}"
    return json.loads(result.stdout)


def _branches(value: Any) -> list[Any]:
    """Both outcomes of an Fn::If (without AWS::NoValue), or the value itself."""
    if isinstance(value, dict) and "Fn::If" in value:
        _, yes, no = value["Fn::If"]
        outcomes = [b for branch in (yes, no) for b in _branches(branch)]
        return [b for b in outcomes if b != {"Ref": "AWS::NoValue"}]
    return [value]


def _statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    statements = []
    for policy in role["Properties"].get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            statements.extend(_branches(statement))
    return statements


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# The wildcards allowed: the objects under the staging bucket's staged/ prefix, and under
# the originals bucket's originals/ prefix.
STAGED_OBJECTS = {"Fn::Sub": "${StagingBucket.Arn}/staged/*"}
ORIGINAL_OBJECTS = {"Fn::Sub": "${OriginalsBucket.Arn}/originals/*"}


def test_no_wildcards_in_iam_policies() -> None:
    resources = translated()["Resources"]
    roles = {name: r for name, r in resources.items() if r["Type"] == "AWS::IAM::Role"}
    assert {"ArchiveFunctionRole", "SweeperFunctionRole"} <= set(roles)
    for name, role in roles.items():
        for statement in _statements(role):
            assert statement["Effect"] == "Allow", (name, statement)
            for target in _listify(statement.get("Resource")):
                if target in (STAGED_OBJECTS, ORIGINAL_OBJECTS):
                    continue  # object keys cannot be listed in advance: only their prefix
                assert "*" not in json.dumps(target), f"{name}: wildcard resource in {statement}"
            for action in _listify(statement["Action"]):
                assert "*" not in action, f"{name}: wildcard action in {statement}"
            assert "NotResource" not in statement, name
            assert "NotAction" not in statement, name
    for function in FUNCTIONS:
        role = resources[function]["Properties"]["Role"]
        assert role == {"Fn::GetAtt": [f"{function}Role", "Arn"]}, (
            f"{function} must use its explicit role (SAM's generated one attaches "
            "AWSLambdaSQSQueueExecutionRole, whose Resource is *)"
        )


def test_managed_policies_only_when_their_feature_is_on() -> None:
    allowed = {
        "AttachToVpc": "AWSLambdaENIManagementAccess",
        "TracingEnabled": "AWSXRayDaemonWriteAccess",
    }
    for role_name in ("ArchiveFunctionRole", "SweeperFunctionRole"):
        for arn in resource(role_name)["Properties"].get("ManagedPolicyArns", []):
            assert "Fn::If" in arn, f"{role_name}: unconditional managed policy {arn}"
            condition, policy, otherwise = arn["Fn::If"]
            assert otherwise == {"Ref": "AWS::NoValue"}
            assert condition in allowed, (role_name, condition)
            assert policy["Fn::Sub"].endswith(f"/{allowed[condition]}"), (role_name, policy)


def _grants(role: str) -> dict[str, list[Any]]:
    """action -> resources granted by a role of the translated template."""
    grants: dict[str, list[Any]] = {}
    for statement in _statements(translated()["Resources"][role]):
        for action in _listify(statement["Action"]):
            grants.setdefault(action, []).extend(_listify(statement["Resource"]))
    return grants


def test_each_function_can_touch_only_its_own_queues_and_secrets() -> None:
    queue = {"Fn::GetAtt": ["ArchiveQueue", "Arn"]}
    dlq = {"Fn::GetAtt": ["ArchiveDLQ", "Arn"]}
    archive, sweeper = _grants("ArchiveFunctionRole"), _grants("SweeperFunctionRole")
    for action in (
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    ):
        assert archive[action] == [queue], action
    assert archive["sqs:SendMessage"] == [dlq], "the archive function sends only to the DLQ"
    assert archive["secretsmanager:GetSecretValue"] == [
        {"Ref": "DbSecretArn"},
        {"Ref": "LskyTokenSecretArn"},
    ]
    assert archive["logs:PutLogEvents"] == [{"Fn::GetAtt": ["ArchiveLogGroup", "Arn"]}]
    assert sweeper["sqs:SendMessage"] == [queue], "the sweeper requeues to the archive queue"
    # ...and reads its depth, for the backlog rule that keeps queued rows from re-sends.
    assert sweeper["sqs:GetQueueAttributes"] == [queue]
    assert {a for a in sweeper if a.startswith("sqs:")} == {
        "sqs:SendMessage",
        "sqs:GetQueueAttributes",
    }
    # The token only for the probe that reopens an account-paused lane.
    assert sorted(sweeper["secretsmanager:GetSecretValue"], key=str) == [
        {"Ref": "DbSecretArn"},
        {"Ref": "LskyTokenSecretArn"},
    ]
    assert sweeper["logs:PutLogEvents"] == [{"Fn::GetAtt": ["SweeperLogGroup", "Arn"]}]


BUS_ARN = {
    "Fn::Sub": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}"
    ":event-bus/${EventBusName}"
}


@pytest.mark.parametrize("role", ["ArchiveFunctionRole", "SweeperFunctionRole"])
def test_each_function_may_put_events_on_the_one_bus_only_when_events_are_on(role: str) -> None:
    """events:PutEvents on EventBusName's ARN (as source image-archive), nothing else of
    EventBridge, and only under PublishEvents: off, the role cannot publish at all."""
    granted = _grants(role)
    assert {a for a in granted if a.startswith("events:")} == {"events:PutEvents"}
    assert granted["events:PutEvents"] == [BUS_ARN]
    statements = resource(role)["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    [(condition, statement, otherwise)] = [
        s["Fn::If"]
        for s in statements
        if "Fn::If" in s and s["Fn::If"][1].get("Action") == "events:PutEvents"
    ]
    assert (condition, otherwise) == ("EventsOn", {"Ref": "AWS::NoValue"})
    assert statement["Condition"] == {"StringEquals": {"events:source": "image-archive"}}
    assert template()["Conditions"]["EventsOn"] == {
        "Fn::Equals": [{"Ref": "PublishEvents"}, "true"]
    }
    assert parameter("PublishEvents")["Default"] == "false"
    assert parameter("EventBusName")["Default"] == "default"
    # The functions learn the bus from ARCHIVE_EVENT_BUS: the bus when on, empty (off) else.
    function = role.removesuffix("Role")
    assert props(function)["Environment"]["Variables"]["ARCHIVE_EVENT_BUS"] == {
        "Fn::If": ["EventsOn", {"Ref": "EventBusName"}, ""]
    }
    # The audit publishes nothing (a restore's event is the archive function's).
    assert "ARCHIVE_EVENT_BUS" not in declared_env("AuditFunction")


def test_the_outbox_s_oldest_age_has_an_alarm_with_the_events() -> None:
    alarm = resource("EventsUnpublishedAlarm")
    assert alarm["Condition"] == "EventsOn"
    properties = alarm["Properties"]
    assert (properties["Namespace"], properties["MetricName"]) == (
        "ImageArchive",
        "EventsUnpublished",
    )
    assert properties["Threshold"] == {"Ref": "EventsUnpublishedAlarmSeconds"}
    assert properties["Dimensions"] == [{"Name": "service", "Value": {"Ref": "ServiceName"}}]
    dropped = resource("EventsDroppedAlarm")
    assert dropped["Condition"] == "EventsOn"
    assert dropped["Properties"]["MetricName"] == "EventsDropped"


def test_secret_permissions_are_conditional_on_the_parameters() -> None:
    conditions = template()["Conditions"]
    statements = resource("ArchiveFunctionRole")["Properties"]["Policies"][0]["PolicyDocument"]
    by_condition = {
        s["Fn::If"][0]: s["Fn::If"][1]["Resource"] for s in statements["Statement"] if "Fn::If" in s
    }
    assert by_condition["HasDbSecret"] == {"Ref": "DbSecretArn"}
    assert by_condition["HasLskyTokenSecret"] == {"Ref": "LskyTokenSecretArn"}
    assert conditions["HasDbSecret"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "DbSecretArn"}, ""]}]}


def test_functions_attach_to_a_vpc_only_when_subnets_are_given() -> None:
    vpc = globals_function()["VpcConfig"]
    condition, config, otherwise = vpc["Fn::If"]
    assert otherwise == {"Ref": "AWS::NoValue"}
    assert condition == "AttachToVpc"
    assert config == {
        "SubnetIds": {"Ref": "SubnetIds"},
        "SecurityGroupIds": {"Ref": "SecurityGroupIds"},
    }
    assert parameter("SubnetIds")["Default"] == "" == parameter("SecurityGroupIds")["Default"]


def evaluate_rule(node: Any, values: dict[str, Any]) -> Any:
    """A template rule condition, evaluated as CloudFormation would for these values."""
    if not isinstance(node, dict):
        return node
    [(function, args)] = node.items()
    if function == "Ref":
        return values[args]
    if function == "Fn::Or":
        return any(evaluate_rule(arg, values) for arg in args)
    if function == "Fn::And":
        return all(evaluate_rule(arg, values) for arg in args)
    if function == "Fn::Not":
        return not evaluate_rule(args[0], values)
    if function == "Fn::Equals":
        return evaluate_rule(args[0], values) == evaluate_rule(args[1], values)
    if function == "Fn::EachMemberEquals":
        members, value = evaluate_rule(args[0], values), evaluate_rule(args[1], values)
        return all(member == value for member in members)
    raise AssertionError(f"no evaluator for {function}")


def comma_list(text: str) -> list[str]:
    # CloudFormation passes a CommaDelimitedList "" as [""].
    return text.split(",")


@pytest.mark.parametrize(
    ("subnets", "groups", "accepted"),
    [
        ("", "", True),
        ("subnet-0a1b2c3d,subnet-4e5f6a7b", "sg-0123456789abcdef0", True),
        ("subnet-0a1b2c3d", "", False),  # would fail late, in the Lambda update
        ("", "sg-0123456789abcdef0", False),  # would be silently ignored
    ],
)
def test_vpc_subnets_and_security_groups_come_together(
    subnets: str, groups: str, accepted: bool
) -> None:
    rule = template()["Rules"]["VpcSettingsComeTogether"]
    values = {"SubnetIds": comma_list(subnets), "SecurityGroupIds": comma_list(groups)}
    results = [evaluate_rule(item["Assert"], values) for item in rule["Assertions"]]
    assert all(results) is accepted
    assert all("SubnetIds" in item["AssertDescription"] for item in rule["Assertions"])


# ---------------------------------------------------------------- alarms, dashboard, outputs


def _alarms() -> list[dict[str, Any]]:
    return [
        r["Properties"]
        for r in template()["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    ]


def _has_alarm(namespace: str, metric: str, dimension_value: Any) -> bool:
    return any(
        alarm.get("Namespace") == namespace
        and alarm.get("MetricName") == metric
        and any(d["Value"] == dimension_value for d in alarm.get("Dimensions", []))
        for alarm in _alarms()
    )


def test_alarms() -> None:
    dlq_name = {"Fn::GetAtt": ["ArchiveDLQ", "QueueName"]}
    queue_name = {"Fn::GetAtt": ["ArchiveQueue", "QueueName"]}
    assert _has_alarm("AWS/SQS", "ApproximateNumberOfMessagesVisible", dlq_name)
    assert _has_alarm("AWS/SQS", "ApproximateAgeOfOldestMessage", queue_name)
    for function in FUNCTIONS:
        for metric in ("Errors", "Throttles"):
            assert _has_alarm("AWS/Lambda", metric, {"Ref": function}), (function, metric)
    for alarm in _alarms():
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmActions"]["Fn::If"][0] == "HasAlarmTopic"
    age = next(a for a in _alarms() if a.get("MetricName") == "ApproximateAgeOfOldestMessage")
    assert ref_of(age["Threshold"]) == "QueueAgeAlarmSeconds"


def test_an_account_paused_lane_raises_an_alarm_and_the_dashboard_shows_the_lane() -> None:
    alarm = props("ArchiveLanePausedAlarm")
    assert (alarm["Namespace"], alarm["MetricName"]) == ("ImageArchive", "LanePausedAccount")
    assert alarm["Threshold"] == 0
    assert "archive-ctl lane clear" in alarm["AlarmDescription"]
    assert "paused" in props("ArchiveQueueOldestMessageAlarm")["AlarmDescription"]
    body = props("ArchiveDashboard")["DashboardBody"]["Fn::Sub"][0]
    for metric in ("RateLimited", "LaneHeld", "LaneParked", "LanePausedSeconds"):
        assert f'"{metric}"' in body, metric


def test_own_faults_raise_an_alarm() -> None:
    # A bad setting or a bug spends no attempt, so only this alarm makes it visible.
    alarm = props("ArchiveOwnFaultAlarm")
    stats = {
        m["MetricStat"]["Metric"]["MetricName"]: m["MetricStat"]["Metric"]
        for m in alarm["Metrics"]
        if "MetricStat" in m
    }
    assert set(stats) == {"ConfigError", "InternalError", "PermissionDenied", "StagingError"}
    # Each of them is a metric the code emits for a fault of ours (lib.archive.faults).
    faults = (ROOT / "src" / "lib" / "archive" / "faults.py").read_text(encoding="utf-8")
    assert all(f'"{name}"' in faults for name in stats)
    for metric in stats.values():
        assert metric["Namespace"] == "ImageArchive"
        assert metric["Dimensions"] == [{"Name": "service", "Value": {"Ref": "ServiceName"}}]
    [expression] = [m for m in alarm["Metrics"] if "Expression" in m]
    assert "config" in expression["Expression"]
    assert "internal" in expression["Expression"]
    assert alarm["Threshold"] == 0


def dashboard_json() -> dict[str, Any]:
    """The dashboard body with its substitutions filled in (numbers for the thresholds,
    nothing for the staging and event alarms, which exist only with their feature on)."""
    body = props("ArchiveDashboard")["DashboardBody"]["Fn::Sub"][0]
    body = body.replace("${StagingAlarms}", "").replace("${EventAlarms}", "")
    body = body.replace("${OriginalsAlarms}", "")
    body = re.sub(r"\$\{(PendingAgeAlarmSeconds|LanePausedAlarmSeconds)\}", "0", body)
    return json.loads(re.sub(r"\$\{[^}]+\}", "x", body))  # type: ignore[no-any-return]


def alarm_names() -> list[str]:
    return [
        name
        for name, body in template()["Resources"].items()
        if body["Type"] == "AWS::CloudWatch::Alarm"
    ]


def test_the_dashboard_shows_every_alarm() -> None:
    body, variables = props("ArchiveDashboard")["DashboardBody"]["Fn::Sub"]
    [widget] = [w for w in dashboard_json()["widgets"] if w["type"] == "alarm"]
    shown = set(re.findall(r"\$\{(\w+)\.Arn\}", body))
    # The staging, event and originals alarms come in through a variable each, present
    # exactly when they exist.
    conditional: set[str] = set()
    for variable, feature in (
        ("StagingAlarms", "StagingOn"),
        ("EventAlarms", "EventsOn"),
        ("OriginalsAlarms", "OriginalsOn"),
    ):
        condition, alarms, otherwise = variables[variable]["Fn::If"]
        assert (condition, otherwise) == (feature, "")
        names = {part["Fn::GetAtt"][0] for part in alarms["Fn::Join"][1] if isinstance(part, dict)}
        for name in names:
            assert resource(name).get("Condition") == feature, name
        conditional |= names
    assert shown | conditional == set(alarm_names())
    assert len(widget["properties"]["alarms"]) == len(shown)


def test_every_way_a_row_can_wait_raises_an_alarm() -> None:
    # Issue 19: rows parked outside the queue, and pauses for any reason, were silent.
    pending = props("ArchivePendingAgeAlarm")
    assert (pending["Namespace"], pending["MetricName"]) == (
        "ImageArchive",
        "OldestPendingAgeSeconds",
    )
    assert ref_of(pending["Threshold"]) == "PendingAgeAlarmSeconds"
    paused = props("ArchiveLanePausedTooLongAlarm")
    assert (paused["Namespace"], paused["MetricName"]) == ("ImageArchive", "LanePausedSeconds")
    assert ref_of(paused["Threshold"]) == "LanePausedAlarmSeconds"
    for alarm in (pending, paused):
        assert alarm["Statistic"] == "Maximum"
        assert alarm["Dimensions"] == [{"Name": "service", "Value": {"Ref": "ServiceName"}}]
        # LanePausedSeconds is sent only while the lane is paused: no data is no alarm.
        assert alarm["TreatMissingData"] == "notBreaching"
    # The default sits above the longest healthy wait of a due row (a lost message is
    # re-sent within the requeue interval plus one schedule; a full backlog drains in 15
    # min) and below the provider URL's life of about an hour.
    healthy = int(parameter("RequeueIntervalSeconds")["Default"]) + 300 + 900
    assert healthy < parameter("PendingAgeAlarmSeconds")["Default"] < 3600
    assert parameter("LanePausedAlarmSeconds")["Default"] < 3600
    unconcluded = props("ArchiveUnconcludedAlarm")
    stats = {m["Id"]: m["MetricStat"] for m in unconcluded["Metrics"] if "MetricStat" in m}
    assert {stat["Metric"]["MetricName"] for stat in stats.values()} == {
        "Unconcluded",
        "InternalError",
    }
    assert {stat["Period"] for stat in stats.values()} == {900}  # sum over 15 minutes
    [expression] = [m["Expression"] for m in unconcluded["Metrics"] if "Expression" in m]
    assert all(f"FILL({name}, 0)" in expression for name in stats)
    assert (unconcluded["Threshold"], unconcluded["ComparisonOperator"]) == (
        0,
        "GreaterThanThreshold",
    )


def test_dashboard_shows_queues_outcomes_and_durations() -> None:
    body, variables = props("ArchiveDashboard")["DashboardBody"]["Fn::Sub"]
    assert set(re.findall(r"\$\{([^}!]+)\}", body)) <= (
        set(variables)
        | set(template()["Resources"])
        | {"AWS::Region", "ServiceName", "PendingAgeAlarmSeconds", "LanePausedAlarmSeconds"}
        | {f"{name}.Arn" for name in template()["Resources"]}
    )
    dashboard = dashboard_json()
    metrics = [
        metric
        for widget in dashboard["widgets"]
        if widget["type"] == "metric"
        for metric in widget["properties"]["metrics"]
    ]
    names = {m[1] for m in metrics if isinstance(m[1], str) and m[1] not in (".", "...")}
    assert names >= EMF_METRICS, f"dashboard lacks {sorted(EMF_METRICS - names)}"
    assert {"ApproximateNumberOfMessagesVisible", "Duration"} <= names
    namespaces = {m[0] for m in metrics if m[0] not in (".", "...")}
    assert "ImageArchive" in namespaces
    # The EMF metrics carry service=<POWERTOOLS_SERVICE_NAME>: the dashboard must use the same.
    assert declared_env("ArchiveFunction")["POWERTOOLS_SERVICE_NAME"] == {"Ref": "ServiceName"}
    assert '"service", "${ServiceName}"' in body
    assert '"${DlqName}"' in body
    assert '"${QueueName}"' in body


def test_outputs() -> None:
    outputs = template()["Outputs"]
    assert outputs["ArchiveQueueUrl"]["Value"] == {"Ref": "ArchiveQueue"}
    assert outputs["ArchiveQueueArn"]["Value"] == {"Fn::GetAtt": ["ArchiveQueue", "Arn"]}
    assert outputs["ArchiveDlqUrl"]["Value"] == {"Ref": "ArchiveDLQ"}
    assert outputs["ArchiveFunctionName"]["Value"] == {"Ref": "ArchiveFunction"}
    assert outputs["SweeperFunctionName"]["Value"] == {"Ref": "SweeperFunction"}


# ---------------------------------------------------------------- staging bucket

STAGING_RESOURCES = ("StagingBucket", "StagingBucketPolicy")
DAY = 86_400
# Lsky's longest window (a month, lib.archive.lane.WINDOWS) pauses the lane that long.
LONGEST_AUTOMATIC_PAUSE_DAYS = 30


def test_staging_bucket_is_encrypted_private_and_expires_its_copies() -> None:
    bucket = props("StagingBucket")
    [rule] = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    block = bucket["PublicAccessBlockConfiguration"]
    assert all(
        block[key] is True
        for key in (
            "BlockPublicAcls",
            "BlockPublicPolicy",
            "IgnorePublicAcls",
            "RestrictPublicBuckets",
        )
    )
    assert bucket["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    [expiry] = bucket["LifecycleConfiguration"]["Rules"]
    assert expiry["Status"] == "Enabled"
    assert expiry["Prefix"] == "staged/"  # the prefix the code writes (lib.archive.staging)
    assert ref_of(expiry["ExpirationInDays"]) == "StagingRetentionDays"
    assert expiry["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] >= 1
    # A copy outlives the longest wait its record can have: a message kept in the DLQ
    # (and redriven) during the longest automatic pause of the lane.
    dlq_days = props("ArchiveDLQ")["MessageRetentionPeriod"] / DAY
    retention = parameter("StagingRetentionDays")
    assert retention["Default"] > dlq_days + LONGEST_AUTOMATIC_PAUSE_DAYS
    assert retention["MinValue"] > dlq_days
    # Retained with the stack: a staged copy may be the only one left of an image.
    assert resource("StagingBucket")["DeletionPolicy"] == "Retain"


def test_staging_bucket_refuses_plain_http() -> None:
    policy = props("StagingBucketPolicy")
    assert policy["Bucket"] == {"Ref": "StagingBucket"}
    [statement] = policy["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == "*"
    assert statement["Action"] == "s3:*"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert {"Fn::GetAtt": ["StagingBucket", "Arn"]} in statement["Resource"]
    assert {"Fn::Sub": "${StagingBucket.Arn}/*"} in statement["Resource"]


def test_archive_function_can_touch_only_staged_objects() -> None:
    archive, sweeper = _grants("ArchiveFunctionRole"), _grants("SweeperFunctionRole")
    staged = STAGED_OBJECTS
    s3 = {action: resources for action, resources in archive.items() if action.startswith("s3:")}
    assert s3 == {
        # Besides the originals' own grant (test_archive_function_only_adds_originals).
        "s3:PutObject": [staged, ORIGINAL_OBJECTS],
        "s3:GetObject": [staged, ORIGINAL_OBJECTS],
        "s3:GetObjectVersion": [ORIGINAL_OBJECTS],
        "s3:DeleteObject": [staged],
        "s3:AbortMultipartUpload": [staged],
        # Only so that a missing object answers 404 rather than 403 (see the template).
        "s3:ListBucket": [
            {"Fn::GetAtt": ["StagingBucket", "Arn"]},
            {"Fn::GetAtt": ["OriginalsBucket", "Arn"]},
        ],
    }
    assert not any(action.startswith("s3:") for action in sweeper)


def _mentions(node: Any, name: str) -> bool:
    text = json.dumps(node)
    return (
        f'"Ref": "{name}"' in text
        or f'["{name}", ' in text
        or f"${{{name}." in text
        or f"${{{name}}}" in text
    )


def _unguarded(node: Any, name: str, condition: str) -> list[Any]:
    """Places that use resource `name` outside the true branch of Fn::If [condition]."""
    if isinstance(node, dict):
        if "Fn::If" in node:
            test, yes, no = node["Fn::If"]
            inside = [] if test == condition else _unguarded(yes, name, condition)
            return inside + _unguarded(no, name, condition)
        if set(node) <= {"Ref", "Fn::GetAtt", "Fn::Sub"} and _mentions(node, name):
            return [node]
        return [found for value in node.values() for found in _unguarded(value, name, condition)]
    if isinstance(node, list):
        return [found for value in node for found in _unguarded(value, name, condition)]
    return []


def test_staging_is_off_cleanly_when_disabled() -> None:
    assert parameter("StagingEnabled")["AllowedValues"] == ["true", "false"]
    assert template()["Conditions"]["StagingOn"] == {
        "Fn::Equals": [{"Ref": "StagingEnabled"}, "true"]
    }
    resources = translated()["Resources"]
    conditional = {name for name, body in resources.items() if body.get("Condition") == "StagingOn"}
    assert set(STAGING_RESOURCES) <= conditional
    # Everything else may use the bucket only under Fn::If [StagingOn, ...].
    for name, body in resources.items():
        if name in conditional:
            continue
        assert not _unguarded(body, "StagingBucket", "StagingOn"), name
    env = declared_env("ArchiveFunction")["ARCHIVE_STAGING_BUCKET"]
    assert env == {"Fn::If": ["StagingOn", {"Ref": "StagingBucket"}, ""]}
    outputs = template()["Outputs"]
    assert outputs["StagingBucketName"]["Condition"] == "StagingOn"


def test_staged_copies_and_staging_failures_raise_alarms() -> None:
    age = props("StagedCopiesAgeAlarm")
    assert resource("StagedCopiesAgeAlarm")["Condition"] == "StagingOn"
    assert (age["Namespace"], age["MetricName"]) == ("ImageArchive", "StagedOldestAgeSeconds")
    assert age["Dimensions"] == [{"Name": "service", "Value": {"Ref": "ServiceName"}}]
    assert ref_of(age["Threshold"]) == "StagedAgeAlarmSeconds"
    assert age["Statistic"] == "Maximum"
    # The alarm must fire well before the lifecycle rule deletes the copy.
    assert parameter("StagedAgeAlarmSeconds")["Default"] < (
        parameter("StagingRetentionDays")["MinValue"] * DAY
    )
    failures = props("StagingFailuresAlarm")
    names = {
        m["MetricStat"]["Metric"]["MetricName"] for m in failures["Metrics"] if "MetricStat" in m
    }
    assert names == {"StagingFailed", "StagingError"}


def test_show_logs_queries_the_log_groups_the_template_creates() -> None:
    """`archive-ctl show --logs` names every function's log group from the stack's name."""
    from lib.cli import logs_insights

    resources = template()["Resources"]
    created = [
        resources[name]["Properties"]["LogGroupName"]["Fn::Sub"]
        for name in ("ArchiveLogGroup", "SweeperLogGroup", "AuditLogGroup")
    ]
    queried = [
        pattern.replace("{stack}", "${AWS::StackName}") for pattern in logs_insights.LOG_GROUPS
    ]
    assert queried == created


# ---------------------------------------------------------------- originals bucket

ORIGINALS_RESOURCES = ("OriginalsBucket", "OriginalsBucketPolicy", "OriginalsFailuresAlarm")


def test_sam_delete_leaves_the_originals_bucket() -> None:
    # The archive's second copy outlives the stack: deleting it, or a template change that
    # replaces the bucket, keeps the bucket, its objects and its TLS-only rule.
    for name in ("OriginalsBucket", "OriginalsBucketPolicy"):
        assert resource(name).get("DeletionPolicy") == "Retain", name
        assert resource(name).get("UpdateReplacePolicy") == "Retain", name


def test_the_originals_bucket_is_versioned_encrypted_and_private() -> None:
    bucket = props("OriginalsBucket")
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    [rule] = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    block = bucket["PublicAccessBlockConfiguration"]
    for key in (
        "BlockPublicAcls",
        "BlockPublicPolicy",
        "IgnorePublicAcls",
        "RestrictPublicBuckets",
    ):
        assert block[key] is True, key
    assert bucket["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    # Nothing expires an original: no lifecycle rule at all.
    assert "LifecycleConfiguration" not in bucket


def test_the_originals_bucket_refuses_plain_http() -> None:
    policy = props("OriginalsBucketPolicy")
    assert policy["Bucket"] == {"Ref": "OriginalsBucket"}
    [statement] = policy["PolicyDocument"]["Statement"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == (
        "Deny",
        "*",
        "s3:*",
    )
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert statement["Resource"] == [
        {"Fn::GetAtt": ["OriginalsBucket", "Arn"]},
        {"Fn::Sub": "${OriginalsBucket.Arn}/*"},
    ]


def test_the_storage_class_parameter_allows_what_the_code_writes() -> None:
    from lib.platform.env_values import DEFAULT_ORIGINALS_STORAGE_CLASS, ORIGINALS_STORAGE_CLASSES

    storage = parameter("OriginalsStorageClass")
    assert storage["AllowedValues"] == [
        "GLACIER_IR",
        "STANDARD",
        "STANDARD_IA",
        "INTELLIGENT_TIERING",
    ]
    assert tuple(storage["AllowedValues"]) == ORIGINALS_STORAGE_CLASSES
    assert storage["Default"] == DEFAULT_ORIGINALS_STORAGE_CLASS == "GLACIER_IR"
    env = declared_env("ArchiveFunction")
    assert env["ARCHIVE_ORIGINALS_STORAGE_CLASS"] == {"Ref": "OriginalsStorageClass"}


def test_originals_are_kept_by_default_and_off_cleanly() -> None:
    keep = parameter("KeepOriginals")
    assert (keep["Default"], keep["AllowedValues"]) == ("true", ["true", "false"])
    assert template()["Conditions"]["OriginalsOn"] == {
        "Fn::Equals": [{"Ref": "KeepOriginals"}, "true"]
    }
    resources = translated()["Resources"]
    on = {name for name, body in resources.items() if body.get("Condition") == "OriginalsOn"}
    assert set(ORIGINALS_RESOURCES) <= on
    for name, body in resources.items():
        if name not in on:
            assert not _unguarded(body, "OriginalsBucket", "OriginalsOn"), name
    env = declared_env("ArchiveFunction")["ARCHIVE_ORIGINALS_BUCKET"]
    assert env == {"Fn::If": ["OriginalsOn", {"Ref": "OriginalsBucket"}, ""]}
    output = template()["Outputs"]["OriginalsBucket"]
    assert (output["Condition"], output["Value"]) == ("OriginalsOn", {"Ref": "OriginalsBucket"})


def test_the_archive_function_may_only_add_and_read_originals() -> None:
    # Writes under originals/ (a CopyObject of a staged copy needs that and the
    # s3:GetObject on staged/* staging grants), a restore's read of a kept version, the
    # listing that tells a missing one: no delete (the archive is kept for good).
    granted = {
        action: [target for target in targets if "OriginalsBucket" in json.dumps(target)]
        for action, targets in _grants("ArchiveFunctionRole").items()
    }
    assert {action: targets for action, targets in granted.items() if targets} == {
        "s3:PutObject": [ORIGINAL_OBJECTS],
        "s3:GetObject": [ORIGINAL_OBJECTS],
        "s3:GetObjectVersion": [ORIGINAL_OBJECTS],
        "s3:ListBucket": [{"Fn::GetAtt": ["OriginalsBucket", "Arn"]}],
    }
    audit = {
        action: [target for target in targets if "OriginalsBucket" in json.dumps(target)]
        for action, targets in _grants("AuditFunctionRole").items()
    }
    # The audit adds, and HEADs an original recorded before S3's answer: no delete.
    assert {action: targets for action, targets in audit.items() if targets} == {
        "s3:PutObject": [ORIGINAL_OBJECTS],
        "s3:GetObject": [ORIGINAL_OBJECTS],
        "s3:ListBucket": [{"Fn::GetAtt": ["OriginalsBucket", "Arn"]}],
    }
    assert ORIGINAL_OBJECTS["Fn::Sub"].endswith("/originals/*")
    from lib.state.claim import ORIGINALS_PREFIX

    assert ORIGINAL_OBJECTS["Fn::Sub"].endswith(f"/{ORIGINALS_PREFIX}*")  # what the code writes
    sweeper = _grants("SweeperFunctionRole")
    assert not any("OriginalsBucket" in json.dumps(targets) for targets in sweeper.values())


def test_originals_not_kept_raise_an_alarm_and_show_on_the_dashboard() -> None:
    alarm = props("OriginalsFailuresAlarm")
    assert (alarm["Namespace"], alarm["MetricName"]) == ("ImageArchive", "OriginalsFailed")
    assert alarm["Dimensions"] == [{"Name": "service", "Value": {"Ref": "ServiceName"}}]
    assert (alarm["Statistic"], alarm["Threshold"]) == ("Sum", 0)
    originals = (ROOT / "src" / "lib" / "archive" / "originals.py").read_text(encoding="utf-8")
    assert '"OriginalsFailed"' in originals
    assert '"OriginalsKept"' in originals
    body = props("ArchiveDashboard")["DashboardBody"]["Fn::Sub"][0]
    for metric in ("OriginalsKept", "OriginalsFailed"):
        assert f'"{metric}"' in body, metric
