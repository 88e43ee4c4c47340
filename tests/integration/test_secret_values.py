"""Secret values as Secrets Manager (moto) holds them, read through Powertools Parameters."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from lib.platform.config import DatabaseConfig
from lib.platform.errors import ConfigError
from lib.platform.secrets import database_params


@pytest.fixture
def secrets(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import boto3
    from aws_lambda_powertools.utilities import parameters

    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.endpoint_url)
    parameters.clear_caches()
    yield boto3.client("secretsmanager")
    parameters.clear_caches()


def secret(client: Any, value: str) -> str:
    return str(client.create_secret(Name=f"db-{time.time_ns()}", SecretString=value)["ARN"])


def test_a_database_secret_is_decoded_by_the_json_transform(secrets: Any) -> None:
    arn = secret(secrets, json.dumps({"username": "u", "password": "pw", "host": "h"}))
    params = database_params(DatabaseConfig(secret_arn=arn))
    assert (params.user, params.password, params.host, params.port) == ("u", "pw", "h", 5432)


@pytest.mark.parametrize("value", ["not json", '"a string"', "[1, 2]"])
def test_a_database_secret_that_is_not_a_json_object_names_the_setting(
    secrets: Any, value: str
) -> None:
    arn = secret(secrets, value)
    with pytest.raises(ConfigError, match="DB_SECRET_ARN") as error:
        database_params(DatabaseConfig(secret_arn=arn))
    assert value not in str(error.value)
