"""A client that opens a TLS connection and never says hello is closed by the clock."""

from __future__ import annotations

import asyncio
import time

from tests.integration.conftest import Harness
from tests.integration.test_grpc_tls import Pki, pki  # noqa: F401  (the module's certificate fixture)


async def test_a_tls_connection_that_never_handshakes_is_closed_after_the_handshake_timeout(
        harness: Harness, pki: Pki) -> None:  # noqa: F811
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls, server__grpc_port=-1, tls__cert_file=str(pki.server_cert),
                              tls__key_file=str(pki.server_key), limits__tls_handshake_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = time.monotonic()
    try:
        # Never send a ClientHello: the proxy must end the connection (EOF or reset) on its own.
        ended = await asyncio.wait_for(reader.read(1024), 5.0)
    except ConnectionResetError:
        ended = b""
    finally:
        writer.close()
    assert ended == b""
    assert 0.4 <= time.monotonic() - started < 3.0
