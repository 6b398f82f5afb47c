"""TLS for the remote API: certificate pinning by SHA-256 fingerprint, or
ordinary CA verification.

With a pin, the SSL context accepts exactly the certificate whose DER bytes
hash to the pinned fingerprint, on every connection: the check sits in the
TLS handshake of each socket (``SSLSocket.do_handshake`` for the sync
client, ``SSLObject.do_handshake`` for the asyncio one, which drives TLS
over memory BIOs), so a connection to another certificate never carries a
request, even after earlier connections were accepted. CA and host name
checks are off then: the pin is the whole trust decision, as for ssh.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from typing import Optional

from .errors import TLSFingerprintError

__all__ = ["normalize_fingerprint", "pinned_context", "ca_context", "format_fingerprint"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def normalize_fingerprint(value: str) -> str:
    """64 lowercase hex characters from a SHA-256 fingerprint written with or
    without colons (or spaces), in any case, with an optional ``sha256:`` /
    ``SHA256=`` prefix. Raises ValueError for anything else."""
    if not isinstance(value, str):
        raise ValueError(f"a TLS fingerprint must be a string, got {type(value).__name__}")
    text = value.strip().lower()
    for prefix in ("sha256:", "sha256=", "sha-256:", "sha-256="):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    text = text.replace(":", "").replace(" ", "").replace("-", "")
    if not _HEX64.match(text):
        raise ValueError(
            f"TLS fingerprint {value!r} is not a SHA-256 fingerprint "
            "(64 hex characters, colons allowed, optional sha256: prefix)"
        )
    return text


def format_fingerprint(hex64: str) -> str:
    """``AB:CD:...`` form, for messages."""
    return ":".join(hex64[i : i + 2] for i in range(0, len(hex64), 2)).upper()


def _check(ssl_obj, expected: str) -> None:
    der = ssl_obj.getpeercert(binary_form=True)
    got = hashlib.sha256(der).hexdigest() if der else "(no certificate)"
    if got != expected:
        raise TLSFingerprintError(expected, got)


class _PinnedSSLSocket(ssl.SSLSocket):
    def do_handshake(self, block: bool = False) -> None:  # type: ignore[override]
        super().do_handshake(block)
        try:
            _check(self, self.context.pinned_fingerprint)  # type: ignore[attr-defined]
        except TLSFingerprintError:
            self.close()
            raise


class _PinnedSSLObject(ssl.SSLObject):
    def do_handshake(self) -> None:
        super().do_handshake()
        _check(self, self.context.pinned_fingerprint)  # type: ignore[attr-defined]


class _PinnedContext(ssl.SSLContext):
    pinned_fingerprint: str


def pinned_context(fingerprint: str) -> ssl.SSLContext:
    """An SSL client context that accepts only the certificate with this
    SHA-256 fingerprint (checked in every handshake)."""
    ctx = _PinnedContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.pinned_fingerprint = normalize_fingerprint(fingerprint)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.sslsocket_class = _PinnedSSLSocket
    ctx.sslobject_class = _PinnedSSLObject
    return ctx


def ca_context(ca_file: Optional[str] = None) -> ssl.SSLContext:
    """Ordinary verification: certifi's CAs (as httpx does), or only ``ca_file``'s."""
    if not ca_file:
        import certifi

        ca_file = certifi.where()
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
