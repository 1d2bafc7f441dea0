"""TLS on both serving ports (HTTP and gRPC), with a throwaway CA made by the openssl CLI."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from tests.integration.conftest import Harness


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # A CA that signed nothing here: trusting only it must fail.
    other_ca: Path


def _make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN=radixgate-test-{name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _issue(d: Path, name: str, extensions: str) -> None:
    """A P-256 key and a one-day certificate for ``name`` signed by the CA in ``d``."""
    (d / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=radixgate-test-{name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-sha256", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    _issue(d, "server", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
                        "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _issue(d, "client", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n")
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
               d / "other-ca.crt")


async def tls_proxy(harness: Harness, pki: Pki, *, mutual: bool) -> App:
    fleet = await harness.fleet()
    tls = {"tls__cert_file": str(pki.server_cert), "tls__key_file": str(pki.server_key)}
    if mutual:
        tls["tls__client_ca_file"] = str(pki.ca)
    return await harness.proxy(fleet.urls, server__grpc_port=-1, **tls)


def client_context(pki: Pki, *, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return ctx


def grpc_credentials(pki: Pki, *, with_cert: bool) -> grpc.ChannelCredentials:
    if with_cert:
        return grpc.ssl_channel_credentials(pki.ca.read_bytes(), pki.client_key.read_bytes(),
                                            pki.client_cert.read_bytes())
    return grpc.ssl_channel_credentials(pki.ca.read_bytes())


REQUEST = pb.GenerateRequest(text="hello there", sampling=pb.SamplingParams(max_new_tokens=3, ignore_eos=True))


async def http_generate(app: App, ctx: ssl.SSLContext | None, scheme: str = "https") -> int:
    async with aiohttp.ClientSession() as s, s.post(
        f"{scheme}://127.0.0.1:{app.http_port}/generate", ssl=ctx if ctx is not None else False,
        json={"text": "hello there", "sampling_params": {"max_new_tokens": 3}},
    ) as r:
        await r.read()
        return r.status


async def grpc_generate(app: App, credentials: grpc.ChannelCredentials | None) -> pb.GenerateUnaryResponse:
    target = f"127.0.0.1:{app.grpc_port}"
    channel = (grpc.aio.secure_channel(target, credentials) if credentials is not None
               else grpc.aio.insecure_channel(target))
    async with channel:
        return await pb_grpc.GenerationStub(channel).GenerateUnary(REQUEST, timeout=5)


async def test_tls_serves_http_and_grpc_to_a_client_that_trusts_the_test_ca(harness: Harness, pki: Pki) -> None:
    app = await tls_proxy(harness, pki, mutual=False)
    assert await http_generate(app, client_context(pki, with_cert=False)) == 200
    reply = await grpc_generate(app, grpc_credentials(pki, with_cert=False))
    assert reply.final.completion_tokens == 3


async def test_with_tls_on_plaintext_clients_are_refused_on_both_ports(harness: Harness, pki: Pki) -> None:
    app = await tls_proxy(harness, pki, mutual=False)
    with pytest.raises(aiohttp.ClientError):
        await http_generate(app, None, scheme="http")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await grpc_generate(app, None)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_does_not_trust_the_ca_is_refused(harness: Harness, pki: Pki) -> None:
    app = await tls_proxy(harness, pki, mutual=False)
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await http_generate(app, ssl.create_default_context(cafile=str(pki.other_ca)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await grpc_generate(app, grpc.ssl_channel_credentials(pki.other_ca.read_bytes()))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate_from_the_client_ca(harness: Harness, pki: Pki) -> None:
    app = await tls_proxy(harness, pki, mutual=True)
    assert await http_generate(app, client_context(pki, with_cert=True)) == 200
    assert (await grpc_generate(app, grpc_credentials(pki, with_cert=True))).final.completion_tokens == 3
    with pytest.raises(aiohttp.ClientError):
        await http_generate(app, client_context(pki, with_cert=False))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await grpc_generate(app, grpc_credentials(pki, with_cert=False))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
