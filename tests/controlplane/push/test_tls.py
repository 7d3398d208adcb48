"""The Fleet port with TLS, and with mutual TLS, on loopback, with a CA the test makes."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agents.control.fleet import ChannelTls, FleetClient
from meridian.procs import stop_child
from tests.kits.controlplane import start_server
from tests.kits.push import Agent, bootstrap_token, seed


@dataclass
class Pair:
    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pair:
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pair


class Ca:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("meridian test CA"))
            .issuer_name(_name("meridian test CA"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pair = _write(directory, "ca", self.cert, self.key)

    def issue(self, stem: str, *, server: bool) -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return _write(self.directory, stem, builder.sign(self.key, hashes.SHA256()), key)


async def _register(target: str, token: str, tls: ChannelTls | None) -> str:
    agent = Agent(target, "us-east", tls=tls)
    try:
        await agent.register(token)
        await agent.connect()
        return (await agent.next()).region.name
    finally:
        await agent.close()


async def test_tls_and_mutual_tls(database_url: str, tmp_path: Path) -> None:
    ca = Ca(tmp_path)
    server_pair = ca.issue("controlplane", server=True)
    client_pair = ca.issue("agent-us-east", server=False)
    (tmp_path / "other").mkdir()
    stranger = Ca(tmp_path / "other")
    stranger_pair = stranger.issue("stranger", server=False)

    tls = {"tls_cert_file": str(server_pair.cert), "tls_key_file": str(server_pair.key)}
    cp = await start_server(database_url, **tls)
    try:
        await seed(cp.url)
        token = await bootstrap_token(cp.url, "us-east")
        assert await _register(cp.grpc_target, token, ChannelTls(ca.pair.cert)) == "us-east"
        with pytest.raises(grpc.aio.AioRpcError) as plaintext:
            await FleetClient(cp.grpc_target).register(token, region="us-east", hostname="h")
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await stop_child(cp.process)

    cp = await start_server(database_url, **tls, tls_client_ca_file=str(ca.pair.cert))
    try:
        token = await bootstrap_token(cp.url, "us-east")
        mutual = ChannelTls(ca.pair.cert, client_pair.cert, client_pair.key)
        assert await _register(cp.grpc_target, token, mutual) == "us-east"
        for without in (
            ChannelTls(ca.pair.cert),  # no client certificate
            ChannelTls(ca.pair.cert, stranger_pair.cert, stranger_pair.key),  # another CA's
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _register(cp.grpc_target, token, without)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await stop_child(cp.process)
