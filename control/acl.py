"""RocketMQ ACL 1.0 request signing, as the Java client's ``AclClientRPCHook`` does it (standard library only).

Written from Apache RocketMQ (develop) ``client/…/acl/common/AclClientRPCHook.doBeforeRequest``,
``AclUtils.combineRequestContent`` / ``calSignature``, ``AclSigner`` (HmacSHA1, Base64, UTF-8) and
``SessionCredentials`` (field names ``AccessKey``, ``SecretKey``, ``Signature``, ``SecurityToken``; its key file is a
Java properties file with those keys). The broker's check is ``PlainAccessResource.parse`` +
``PlainPermissionManager.validate`` (sohutv/rocketmq 5.3.1-sohu-01 ``acl/…/plain``): it rebuilds the same content
from the request's ext fields and refuses a missing ``AccessKey``, an unknown one or a wrong ``Signature`` with an
``AclException``, which the remoting server answers as ``SYSTEM_ERROR`` (``NettyRemotingAbstract``).

The signed content: the **values** of every ext field except ``Signature`` (``AccessKey`` and ``SecurityToken``
included), in the order of their **names** sorted (Java ``TreeMap``: by UTF-16 code unit), concatenated, UTF-8, then
the body bytes. The signature is Base64(HMAC-SHA1(secret key, content)).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"


class AclKeyError(Exception):
    """ACL keys configured but unusable: a key file that is missing, unreadable or lacks a key; one of the two
    environment variables set without the other."""


@dataclass(frozen=True)
class SessionCredentials:
    """An ACL account (``SessionCredentials``): access key, secret key, optional security token."""

    access_key: str
    secret_key: str = ""
    security_token: str | None = None

    def __repr__(self) -> str:  # never print the secret
        return f"SessionCredentials(access_key={self.access_key!r}, secret_key=***)"


def _java_sort_key(name: str) -> list[int]:
    """``String.compareTo`` order (UTF-16 code units), which ``TreeMap`` uses; differs from Python's code-point order
    only for characters beyond the BMP."""
    data = name.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def signature(ext_fields: dict[str, str], body: bytes, secret_key: str) -> str:
    """``AclUtils.calSignature(AclUtils.combineRequestContent(request, sorted ext fields), secretKey)``."""
    content = "".join(v for k, v in sorted(ext_fields.items(), key=lambda kv: _java_sort_key(kv[0]))
                      if k != SIGNATURE).encode("utf-8") + (body or b"")
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(ext_fields: dict[str, str] | None, body: bytes, credentials: SessionCredentials) -> dict[str, str]:
    """``AclClientRPCHook.doBeforeRequest``: a copy of ``ext_fields`` with ``AccessKey`` (and ``SecurityToken``)
    added and ``Signature`` computed over them and ``body``."""
    fields = {str(k): str(v) for k, v in (ext_fields or {}).items()}
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = signature(fields, body, credentials.secret_key)
    return fields


def _properties(text: str) -> dict[str, str]:
    """The ``key=value`` / ``key: value`` lines of a Java properties file (comments and blank lines skipped; the
    escapes and line continuations of ``Properties.load`` are not needed for keys)."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut > 0:
            out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def load_credentials(access_key_env: str, secret_key_env: str, key_file: str | os.PathLike[str] | None
                     ) -> SessionCredentials | None:
    """The ACL account for admin requests: the two environment variables when set, else ``key_file`` (a
    ``SessionCredentials`` key file: ``AccessKey=…`` and ``SecretKey=…`` lines, optional ``SecurityToken=…``), else
    None (requests go unsigned, for clusters without ACL).

    Raises:
        AclKeyError: only one of the two variables is set; the key file is missing, unreadable, or lacks
            ``AccessKey`` or ``SecretKey``.
    """
    access = os.environ.get(access_key_env, "").strip() if access_key_env else ""
    secret = os.environ.get(secret_key_env, "").strip() if secret_key_env else ""
    if access or secret:
        if not (access and secret):
            missing = secret_key_env if access else access_key_env
            raise AclKeyError(f"ACL keys: environment variable {missing} is not set (both keys are needed)")
        return SessionCredentials(access, secret)
    if key_file is None or str(key_file) == "":
        return None
    path = Path(key_file)
    try:
        props = _properties(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AclKeyError(f"ACL key file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AclKeyError(f"cannot read ACL key file {path}: {exc}") from None
    if not props.get(ACCESS_KEY) or not props.get(SECRET_KEY):
        raise AclKeyError(f"ACL key file {path} needs both {ACCESS_KEY}= and {SECRET_KEY}= lines")
    return SessionCredentials(props[ACCESS_KEY], props[SECRET_KEY], props.get(SECURITY_TOKEN) or None)
