"""DB_SSLMODE=verify-full against a real TLS PostgreSQL whose certificate comes from a private
CA, as an RDS certificate does: it connects only with that CA as DB_SSL_ROOT_CERT."""

from __future__ import annotations

import datetime
import os
import pwd
import shutil
import ssl
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from devkit.postgres import PostgresCluster, connect
from lib.platform.config import load_database_config
from lib.platform.db import Database
from lib.platform.errors import DatabaseUnavailable
from tests.support import HANG_SECONDS

cryptography = pytest.importorskip("cryptography")


@dataclass(frozen=True)
class TlsServer:
    port: int
    database: str
    ca_file: Path

    def url(self, host: str) -> str:
        return f"postgresql://postgres@{host}:{self.port}/{self.database}"


def _write_ca_and_server_cert(directory: Path) -> Path:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Test RDS-like Root CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        # The name only: connecting to 127.0.0.1 must fail verify-full's host check.
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.crt").write_bytes(server.public_bytes(pem))
    (directory / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (directory / "server.key").chmod(0o600)  # PostgreSQL refuses a readable key
    return directory / "ca.pem"


def _wait_for_tls(dsn: str) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + HANG_SECONDS
    while True:
        try:
            connect(dsn, ssl_context=context).close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        else:
            return


@pytest.fixture(scope="module")
def tls_server(pg_cluster: PostgresCluster | None, pg_dsn: str) -> Iterator[TlsServer]:
    """The throwaway cluster with TLS switched on (ALTER SYSTEM, reload) for this module."""
    if pg_cluster is None:
        pytest.skip("switches TLS on for the throwaway cluster; TEST_DATABASE_URL is set")
    directory = Path(tempfile.mkdtemp(prefix="pg-tls-"))
    ca_file = _write_ca_and_server_cert(directory)
    if os.geteuid() == 0:  # the server runs as the postgres user (devkit.postgres)
        owner = pwd.getpwnam("postgres")
        for path in (directory, *directory.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    admin = connect(pg_cluster.dsn)
    try:
        admin.run(f"ALTER SYSTEM SET ssl_cert_file = '{directory / 'server.crt'}'")
        admin.run(f"ALTER SYSTEM SET ssl_key_file = '{directory / 'server.key'}'")
        admin.run("ALTER SYSTEM SET ssl = on")
        admin.run("SELECT pg_reload_conf()")
        _wait_for_tls(pg_dsn)
        parts = urlsplit(pg_dsn)
        yield TlsServer(int(parts.port or 5432), parts.path.lstrip("/"), ca_file)
    finally:
        for setting in ("ssl", "ssl_cert_file", "ssl_key_file"):
            admin.run(f"ALTER SYSTEM RESET {setting}")
        admin.run("SELECT pg_reload_conf()")
        admin.close()
        shutil.rmtree(directory, ignore_errors=True)


def _database(url: str, **env: str) -> Database:
    config = load_database_config({"DATABASE_URL": url, "DB_SSLMODE": "verify-full", **env})
    return Database(config, application_name="tls-test")


def _encrypted(database: Database) -> Any:
    return database.run("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")


def test_verify_full_connects_with_the_ca_bundle_from_db_ssl_root_cert(
    tls_server: TlsServer,
) -> None:
    database = _database(tls_server.url("localhost"), DB_SSL_ROOT_CERT=str(tls_server.ca_file))
    try:
        assert _encrypted(database) == [[True]]
    finally:
        database.close()


def test_verify_full_without_the_bundle_refuses_the_private_ca(tls_server: TlsServer) -> None:
    database = _database(tls_server.url("localhost"))
    with pytest.raises(DatabaseUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        _encrypted(database)


def test_verify_full_checks_the_host_name_too(tls_server: TlsServer) -> None:
    database = _database(tls_server.url("127.0.0.1"), DB_SSL_ROOT_CERT=str(tls_server.ca_file))
    with pytest.raises(DatabaseUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        _encrypted(database)
