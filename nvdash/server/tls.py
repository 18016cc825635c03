"""Checks a TLS certificate and key before the server starts, so a bad file is one clear line, not a traceback."""

from __future__ import annotations

import ssl
from pathlib import Path


class CertificateError(ValueError):
    """The certificate or key cannot be used; the message is one line naming the file."""


def _read(path: str, option: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise CertificateError(f"{option}: cannot read {path}: {error.strerror or error}") from None


def check_certificate(certfile: str, keyfile: str | None = None) -> None:
    """Load ``certfile`` and ``keyfile`` (``None``: the key is in ``certfile``) as the server will.

    Raises :class:`CertificateError` for a missing or unreadable file, a file without the expected PEM block,
    an encrypted key (the server could only prompt for its password) or a key that is not the certificate's.
    """
    certificate = _read(certfile, "--certfile")
    key_option, key_path = ("--keyfile", keyfile) if keyfile is not None else ("--certfile", certfile)
    key = _read(key_path, key_option) if keyfile is not None else certificate
    if "-----BEGIN CERTIFICATE-----" not in certificate:
        raise CertificateError(f"--certfile: {certfile} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if "PRIVATE KEY-----" not in key:
        hint = "" if keyfile is not None else "; name the key with --keyfile"
        raise CertificateError(f"{key_option}: {key_path} holds no PEM private key{hint}")
    if "ENCRYPTED" in key:
        raise CertificateError(f"{key_option}: the key in {key_path} is encrypted; give an unencrypted key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile, password=lambda: b"")
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise CertificateError(f"the key in {key_path} does not belong to the certificate in {certfile}") from None
        raise CertificateError(f"cannot use the certificate {certfile} with the key {key_path}: "
                               f"{error.reason or 'not a valid PEM certificate and key'}") from None
    except OSError as error:
        raise CertificateError(f"cannot read {certfile} or {key_path}: {error.strerror or error}") from None
