"""A TCP proxy in front of a TCPStore server that counts the requests its clients send.

Every byte from a client is parsed as torch's TCPStore protocol (one query type byte, then that query's
fields: strings and payloads as a u64 length and bytes, counts and values fixed-size, native little
endian), so the counts are requests, not reads or packets. A client whose stream cannot be parsed (an
unknown query type) is counted once in `unparsed` and passed on as is.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

# torch/csrc/distributed/c10d/TCPStoreBackend.hpp, QueryType
QUERY_NAMES = [
    "VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY", "APPEND",
    "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS",
]
# What follows the type byte: s = string or payload (u64 length + bytes), n = u64 count of keys,
# N = u64 count of (key, payload) pairs, 4 / 8 = a fixed-size value.
_FIELDS = {
    "VALIDATE": "4", "SET": "ss", "COMPARE_SET": "sss", "GET": "s", "ADD": "s8", "CHECK": "n", "WAIT": "n",
    "GETNUMKEYS": "", "DELETE_KEY": "s", "APPEND": "ss", "MULTI_GET": "n", "MULTI_SET": "N",
    "CANCEL_WAIT": "", "PING": "4", "QUEUE_PUSH": "ss", "QUEUE_LEN": "s", "LIST_KEYS": "",
}


def _parse_one(buf: bytes, pos: int) -> tuple[str, int] | None:
    """(query name, end) of the request at `pos`, None if `buf` does not hold all of it yet."""
    if pos >= len(buf):
        return None
    kind = buf[pos]
    if kind >= len(QUERY_NAMES) or QUERY_NAMES[kind] not in _FIELDS:
        raise ValueError(f"query type {kind}")
    name = QUERY_NAMES[kind]
    pos += 1

    def u64(at: int) -> int | None:
        return struct.unpack_from("<Q", buf, at)[0] if at + 8 <= len(buf) else None

    def string(at: int) -> int | None:
        n = u64(at)
        return None if n is None or at + 8 + n > len(buf) else at + 8 + n

    for f in _FIELDS[name]:
        if f in "48":
            pos += int(f)
            if pos > len(buf):
                return None
        elif f == "s":
            nxt = string(pos)
            if nxt is None:
                return None
            pos = nxt
        else:  # n or N
            count = u64(pos)
            if count is None:
                return None
            pos += 8
            for _ in range(count * (2 if f == "N" else 1)):
                nxt = string(pos)
                if nxt is None:
                    return None
                pos = nxt
    return name, pos


@dataclass
class _Client:
    buf: bytearray = field(default_factory=bytearray)
    broken: bool = False


class StoreProxy:
    """Listens on 127.0.0.1:`port` and forwards each connection to 127.0.0.1:`target`, on one thread."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.counts: Counter[str] = Counter()
        self.unparsed = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.port = int(self._listener.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-proxy", daemon=True)
        self._thread.start()

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values()) + self.unparsed

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _count(self, client: _Client, data: bytes) -> None:
        if client.broken:
            return
        client.buf += data
        pos = 0
        try:
            while (parsed := _parse_one(bytes(client.buf), pos)) is not None:
                name, pos = parsed
                with self._lock:
                    self.counts[name] += 1
        except ValueError:
            client.broken = True
            with self._lock:
                self.unparsed += 1
        del client.buf[:pos]

    def _run(self) -> None:
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        peers: dict[socket.socket, tuple[socket.socket, _Client | None]] = {}
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.1):
                sock = key.fileobj
                if sock is self._listener:
                    try:
                        down, _ = self._listener.accept()
                        up = socket.create_connection(("127.0.0.1", self.target))
                    except OSError:
                        continue
                    down.setblocking(True)
                    client = _Client()
                    peers[down] = (up, client)  # client -> server: counted
                    peers[up] = (down, None)
                    for s in (down, up):
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self._sel.register(s, selectors.EVENT_READ, None)
                    with self._lock:
                        self.connections += 1
                    continue
                other, client = peers.get(sock, (None, None))
                if other is None:
                    continue
                try:
                    data = sock.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    for s in (sock, other):
                        if s in peers:
                            self._sel.unregister(s)
                            peers.pop(s)
                            s.close()
                    continue
                if client is not None:
                    self._count(client, data)
                try:
                    other.sendall(data)  # blocking: the peer reads promptly, and requests are small
                except OSError:
                    pass
        for s in list(peers):
            s.close()
