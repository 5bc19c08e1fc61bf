"""A synchronous RocketMQ remoting client whose connections survive server restarts and idle timeouts.

Modelled on Apache RocketMQ's ``NettyRemotingClient.invokeSync`` (develop): one TCP connection per address, a
response matched to its request by ``opaque``, a channel that is no longer active closed and opened again
(``getAndCreateChannel`` checks ``channel.isActive()``). Python learns that a server closed a socket only when it
reads, so before each request the connection is checked without blocking (a readable socket with nothing to read
is closed) and renewed when it has been idle longer than ``renew_after_s`` (by default 90 % of the server's
``NettyServerConfig.serverChannelMaxIdleTimeSeconds``, 120 s: its ``IdleStateHandler`` closes a connection idle
that long). A request that still meets a connection the server closed (a reset, or EOF before the answer) is sent
once more on a new connection, when it is ``idempotent`` (the sink's requests are: views, absolute updates, config
and cluster reads).

Per server it remembers the ``version`` of the last response (``MQVersion.Version`` ordinal,
:func:`control.remoting.is_rocketmq5`) and the header format it answers in: a server started with
``rocketmq.serialize.type=ROCKETMQ`` answers binary headers, and the next requests to it are sent binary too.
With ``credentials`` every request is signed as ``AclClientRPCHook`` does (:mod:`control.acl`).

Thread-safe: requests to different addresses run in parallel, requests to one address one at a time.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
import time

from control import acl
from control import remoting as rm

__all__ = ["RemotingClient"]


class _Conn:
    __slots__ = ("sock", "last_used")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.last_used = time.monotonic()


def _peer_closed(sock: socket.socket) -> bool:
    """True when the peer has closed (or reset) ``sock``: readable at once, and reading shows EOF or an error. A
    readable socket with bytes waiting (a late answer) is still open; :func:`rm.read_frame` skips such strays."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


class RemotingClient:
    """Request/response over one reused TCP connection per address (see the module docstring).

    Args:
        timeout_s: default time for one request, connecting included.
        idle_timeout_s: the servers' idle timeout (``serverChannelMaxIdleTimeSeconds``, 120 s); a connection idle
            for 90 % of it is renewed before use.
        credentials: sign every request for ACL-enabled clusters (None: unsigned).
    Attributes:
        server_version: address → ``version`` of its last response. server_serialize: address → header format it
        answered in. connects: address → connections opened (tests and logs).
    """

    def __init__(self, timeout_s: float = 3.0, idle_timeout_s: float = 120.0,
                 credentials: acl.SessionCredentials | None = None,
                 max_frame_bytes: int = rm.MAX_FRAME_BYTES) -> None:
        self.timeout_s = timeout_s
        self.renew_after_s = 0.9 * idle_timeout_s
        self.credentials = credentials
        self.max_frame_bytes = max_frame_bytes
        self.server_version: dict[str, int] = {}
        self.server_serialize: dict[str, int] = {}
        self.connects: dict[str, int] = {}
        self._conns: dict[str, _Conn] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._opaque = itertools.count(1)

    def _lock(self, addr: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(addr, threading.Lock())

    def _connection(self, addr: str, deadline: float) -> tuple[_Conn, bool]:
        """(an open connection to ``addr``, whether it was reused rather than just opened)."""
        conn = self._conns.get(addr)
        if conn is not None and (time.monotonic() - conn.last_used >= self.renew_after_s or _peer_closed(conn.sock)):
            self._drop(addr)
            conn = None
        if conn is not None:
            return conn, True
        host, port = rm.parse_addr(addr)
        sock = socket.create_connection((host, port), timeout=max(0.001, deadline - time.monotonic()))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._conns[addr] = _Conn(sock)
        with self._guard:
            self.connects[addr] = self.connects.get(addr, 0) + 1
        return conn, False

    def invoke(self, addr: str, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"",
               timeout_s: float | None = None, idempotent: bool = True) -> rm.RemotingCommand:
        """Send request ``code`` to ``addr`` and return its response (any response code; callers check it).

        Raises:
            RemotingTimeout: no matching response in time. RemotingProtocolError: a bad frame. RemotingError:
            connection refused/reset (wrapping the ``OSError``); ``ValueError`` for a malformed ``addr``.
        """
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        if self.credentials is not None:
            ext_fields = acl.sign(ext_fields, body, self.credentials)
        with self._lock(addr):
            request = rm.RemotingCommand(code, ext_fields, next(self._opaque) & 0x7FFFFFFF, body=body,
                                         serialize_type=self.server_serialize.get(addr, rm.SERIALIZE_JSON))
            for attempt in (1, 2):
                reused = False
                try:
                    conn, reused = self._connection(addr, deadline)
                    reply = self._exchange(conn.sock, addr, request, deadline)
                    conn.last_used = time.monotonic()
                    self.server_version[addr] = reply.version
                    self.server_serialize[addr] = reply.serialize_type
                    return reply
                except (rm.RemotingConnectionClosed, ConnectionError) as exc:
                    self._drop(addr)
                    if attempt == 1 and reused and idempotent and deadline > time.monotonic():
                        continue  # the server closed a connection we had kept: once more on a new one
                    if isinstance(exc, rm.RemotingError):
                        raise
                    raise rm.RemotingError(f"{addr}: {exc}") from exc
                except rm.RemotingError:
                    self._drop(addr)
                    raise
                except socket.timeout:
                    self._drop(addr)
                    raise rm.RemotingTimeout(f"timed out talking to {addr} (code {code})") from None
                except OSError as exc:
                    self._drop(addr)
                    raise rm.RemotingError(f"{addr}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, sock: socket.socket, addr: str, request: rm.RemotingCommand,
                  deadline: float) -> rm.RemotingCommand:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(rm.encode(request))
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise rm.RemotingTimeout(f"no response from {addr} to code {request.code}")
            sock.settimeout(remaining)
            reply = rm.read_frame(sock, self.max_frame_bytes)
            if reply.is_response and reply.opaque == request.opaque:
                return reply

    def _drop(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.sock.close()

    def close(self) -> None:
        with self._guard:
            addrs = list(self._conns)
        for addr in addrs:
            with self._lock(addr):
                self._drop(addr)
