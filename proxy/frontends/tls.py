"""TLS for the serving ports, from one ``tls`` config section.

Both fronts read the same PEM files: the HTTP port through an ``ssl.SSLContext`` handed to
aiohttp's ``TCPSite``, the gRPC port through ``grpc.ssl_server_credentials``. With
``client_ca_file`` set, both require a client certificate signed by one of those CAs (mutual TLS).
Nothing here is read per request: files are loaded once at start-up, so a bad file fails the start.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from proxy.config import TlsConfig


def http_ssl_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """Server-side context for aiohttp, or ``None`` when TLS is off."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        ctx.load_verify_locations(cafile=tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def grpc_server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    """Credentials for ``server.add_secure_port``, or ``None`` when TLS is off."""
    if not tls.enabled:
        return None
    pair = (Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())
    if tls.client_ca_file:
        return grpc.ssl_server_credentials(
            [pair], root_certificates=Path(tls.client_ca_file).read_bytes(), require_client_auth=True
        )
    return grpc.ssl_server_credentials([pair])
