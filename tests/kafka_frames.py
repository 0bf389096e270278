"""Kafka's wire framing for the TCP proxies that broker tests put between a client and a broker
(tests/broker/test_slow_answers.py holds an answer back; tests/broker/test_versions_broker.py records markers)."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator


def frames(sock: socket.socket) -> Iterator[bytes]:
    """Kafka frames (int32 size, then the payload) read from `sock` until it closes."""
    while True:
        head = read_exactly(sock, 4)
        if head is None:
            return
        body = read_exactly(sock, struct.unpack(">i", head)[0])
        if body is None:
            return
        yield head + body


def read_exactly(sock: socket.socket, n: int) -> bytes | None:
    """`n` bytes from `sock`, or None if it closed or failed first."""
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def send(sock: socket.socket, data: bytes) -> bool:
    """Whether all of `data` was sent."""
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def close(*socks: socket.socket) -> None:
    """Shut both directions of each socket down, ignoring those already gone."""
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
