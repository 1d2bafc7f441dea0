"""Keys and certificates rotated while serving (proxy/rotation.py): the keys file and the TLS pair
re-read when they change and on SIGHUP; a rotation that does not load keeps the previous secret.
Real proxies (in process, and ``radixgate serve`` as a process) on 127.0.0.1; certificates made by
the openssl CLI."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import ssl
from pathlib import Path

import aiohttp
import grpc
import pytest

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from tests.integration.conftest import Harness, admin, base, eventually
from tests.integration.reliability import proxy_process
from tests.integration.test_grpc_tls import _issue, _make_ca

BODY = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
SERVER_EXT = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
              "subjectAltName=DNS:localhost,IP:127.0.0.1\n")


def replace(path: Path, text: str | bytes) -> None:
    """Swap the file in one rename, as a Secret volume's update does."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(text.encode() if isinstance(text, str) else text)
    os.replace(tmp, path)


async def status(client: aiohttp.ClientSession, url: str, key: str) -> int:
    async with client.post(url + "/generate", json=BODY, headers={"Authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status


async def reloads(client: aiohttp.ClientSession, app: App) -> dict[tuple[str, str], float]:
    async with client.get(f"{admin(app)}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("radixgate_secret_reloads_total{"):
            secret = line.split('secret="', 1)[1].split('"', 1)[0]
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[(secret, outcome)] = float(line.rsplit(" ", 1)[1])
    return out


async def test_a_rotated_keys_file_is_served_and_a_bad_one_keeps_the_previous_keys(
    harness: Harness, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    fleet = await harness.fleet()
    keys = tmp_path / "keys"
    keys.write_text("old-key\n")
    app = await harness.proxy(fleet.urls, security__api_keys_file=str(keys), security__reload_interval_s=0.02)
    url = base(app)
    assert await status(client, url, "old-key") == 200 and await status(client, url, "new-key") == 401

    replace(keys, "# rotated\nnew-key\n")

    async def rotated() -> bool:
        return await status(client, url, "new-key") == 200
    await eventually(rotated, what="the new key to be accepted")
    assert await status(client, url, "old-key") == 401

    replace(keys, "# nothing left\n")  # an empty file would open the port: refused, the keys stay

    async def refused() -> bool:
        return (await reloads(client, app)).get(("api_keys", "failed"), 0) == 1
    await eventually(refused, what="the empty file's reload to fail")
    assert await status(client, url, "new-key") == 200 and await status(client, url, "") == 401
    assert (await reloads(client, app))[("api_keys", "ok")] == 1


@pytest.fixture(scope="module")
def two_cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two directories, each a CA (ca.crt) and a server pair it signed (server.crt, server.key)."""
    dirs = []
    for name in ("first", "second"):
        d = tmp_path_factory.mktemp(name)
        _make_ca(d, "ca")
        _issue(d, "server", SERVER_EXT)
        dirs.append(d)
    return dirs[0], dirs[1]


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def pem(path: Path) -> bytes:
    return path.read_bytes()


async def https_ok(url: str, ca: Path) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/health", ssl=trusting(ca)) as r:
            return r.status == 200
    except aiohttp.ClientConnectorCertificateError:
        return False


async def grpc_ok(port: int, ca: Path) -> bool:
    creds = grpc.ssl_channel_credentials(root_certificates=pem(ca))
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds,
                                       options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
        try:
            req = pb.GenerateRequest(text="hello", sampling=pb.SamplingParams(max_new_tokens=2))
            await pb_grpc.GenerationStub(ch).GenerateUnary(req, timeout=5)
            return True
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # the handshake, not the call
            return False


async def test_a_rotated_certificate_is_served_to_new_connections_on_both_ports(
    harness: Harness, tmp_path: Path, two_cas: tuple[Path, Path]
) -> None:
    first, second = two_cas
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first / "server.crt", cert)
    shutil.copy(first / "server.key", key)
    fleet = await harness.fleet()
    # Checked by SIGHUP's path only (interval 0): the test says when the rotation happens.
    app = await harness.proxy(fleet.urls, tls__cert_file=str(cert), tls__key_file=str(key),
                              server__grpc_port=-1, security__reload_interval_s=0)
    url = f"https://127.0.0.1:{app.http_port}"
    assert await https_ok(url, first / "ca.crt") and not await https_ok(url, second / "ca.crt")
    assert await grpc_ok(app.grpc_port, first / "ca.crt")

    replace(cert, (second / "server.crt").read_bytes())
    replace(key, (second / "server.key").read_bytes())
    app.rotation.reload_all()
    assert await https_ok(url, second / "ca.crt") and not await https_ok(url, first / "ca.crt")
    assert await grpc_ok(app.grpc_port, second / "ca.crt")
    assert not await grpc_ok(app.grpc_port, first / "ca.crt")

    # A certificate that does not match its key (half a rotation): refused, the second pair stays.
    replace(cert, (first / "server.crt").read_bytes())
    app.rotation.reload_all()
    assert await https_ok(url, second / "ca.crt") and await grpc_ok(app.grpc_port, second / "ca.crt")
    async with aiohttp.ClientSession() as s:
        assert await reloads(s, app) == {("tls", "ok"): 1, ("tls", "failed"): 1}


async def test_sighup_rereads_the_keys_file(harness: Harness, tmp_path: Path) -> None:
    fleet = await harness.fleet()
    keys = tmp_path / "keys"
    keys.write_text("old-key\n")
    config = {"workers": {"static": [fleet.urls[0]]},
              "security": {"api_keys_file": str(keys), "reload_interval_s": 0}}
    async with proxy_process(config, tmp_path) as served, aiohttp.ClientSession() as s:
        url = served.http
        assert await status(s, url, "old-key") == 200
        replace(keys, "new-key\n")
        await asyncio.sleep(0.1)
        assert await status(s, url, "new-key") == 401  # no interval: nothing re-read yet
        served.proc.send_signal(signal.SIGHUP)

        async def rotated() -> bool:
            return await status(s, url, "new-key") == 200
        await eventually(rotated, what="SIGHUP to rotate the keys")
        assert await status(s, url, "old-key") == 401
        assert await served.terminate() == 0
