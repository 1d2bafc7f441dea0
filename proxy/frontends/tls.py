"""TLS for the serving ports, from one ``tls`` config section, re-read while serving.

Both fronts read the same PEM files: the HTTP port through one ``ssl.SSLContext`` handed to
aiohttp's ``TCPSite``, the gRPC port through ``grpc.dynamic_ssl_server_credentials``. With
``client_ca_file`` set, both require a client certificate signed by one of those CAs (mutual TLS).
Nothing here is read per request. The files are loaded at start-up (a bad file fails the start)
and again by ``ServingTls.reload`` (``proxy/rotation.py``: when they change, and on SIGHUP), so a
rotated certificate (cert-manager renewing a Secret) is served to new connections without a
restart; connections already open keep the certificate they were made with. A pair that does not
load is refused whole and the old one stays. The client CA bundle is read at start-up only.
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


class ServingTls:
    """The serving ports' certificate, one for both fronts; ``reload()`` swaps it for new connections."""

    def __init__(self, tls: TlsConfig) -> None:
        self.config = tls
        self.context = http_ssl_context(tls)
        self._ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
        self._grpc_next: grpc.ServerCertificateConfiguration | None = None

    @property
    def files(self) -> tuple[str, ...]:
        return (self.config.cert_file, self.config.key_file) if self.config.enabled else ()

    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        """Credentials for ``server.add_secure_port``, or ``None`` when TLS is off."""
        if not self.config.enabled:
            return None
        return grpc.dynamic_ssl_server_credentials(
            # grpc's docs: the fetcher returns None for "no change"; its type stubs do not say so.
            self._grpc_configuration(), self._grpc_fetch,  # type: ignore[arg-type]
            require_client_authentication=self._ca is not None)

    def reload(self) -> None:
        """Read the certificate and key again; raises (``OSError``, ``ssl.SSLError``) with nothing
        changed when they do not load as a pair."""
        if self.context is None:
            return
        cert, key = self.config.cert_file, self.config.key_file
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)  # the check
        configuration = self._grpc_configuration()
        self.context.load_cert_chain(cert, key)  # new handshakes use it
        self._grpc_next = configuration

    def _grpc_configuration(self) -> grpc.ServerCertificateConfiguration:
        pair = (Path(self.config.key_file).read_bytes(), Path(self.config.cert_file).read_bytes())
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=self._ca)

    def _grpc_fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Asked by grpc before each new connection: a new configuration once, else None (no change)."""
        configuration, self._grpc_next = self._grpc_next, None
        return configuration
