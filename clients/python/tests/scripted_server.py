"""A tiny HTTP/1.1 server on a raw socket that misbehaves on cue: each
connection gets the next scripted behaviour (answer, cut the body short,
trickle it, hang, or close), so the clients' timeouts and connection
failures can be tested byte for byte."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Callable, Dict, List, Optional, Tuple, Type

Behaviour = Callable[[socket.socket, threading.Event], None]
"""Given the connection (its request read) and an event set when the server stops."""


@dataclass
class Request:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes


def _head(status: int, headers: Dict[str, str], length: int) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"Content-Length: {length}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode()


def respond(status: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(status, headers or {}, len(body)) + body)

    return run


def cut(status: int, body: bytes, sent: int) -> Behaviour:
    """Announces the whole body, sends ``sent`` bytes of it, and closes."""

    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(status, {"Content-Type": "application/json"}, len(body)) + body[:sent])

    return run


def trickle(status: int, body: bytes, every: float) -> Behaviour:
    """Sends the head at once, then the body a byte at a time."""

    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(status, {"Content-Type": "application/json"}, len(body)))
        for i in range(len(body)):
            if stop.wait(every):
                return
            conn.sendall(body[i : i + 1])

    return run


def hang(seconds: float) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        stop.wait(seconds)

    return run


def close() -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        pass

    return run


@dataclass
class ScriptedServer:
    script: List[Behaviour]
    requests: List[Request] = field(default_factory=list)
    _sock: socket.socket = field(init=False)
    _threads: List[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> ScriptedServer:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._sock.close()

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            behaviour = self.script.pop(0) if self.script else respond(599)
            worker = threading.Thread(target=self._serve, args=(conn, behaviour), daemon=True)
            worker.start()
            self._threads.append(worker)

    def _serve(self, conn: socket.socket, behaviour: Behaviour) -> None:
        with conn:
            conn.settimeout(5)
            try:
                self.requests.append(self._read(conn))
                behaviour(conn, self._stop)
            except OSError:
                pass

    @staticmethod
    def _read(conn: socket.socket) -> Request:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed before the request's head")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return Request(method, path, headers, body)


def free_port() -> Tuple[str, int]:
    """A loopback port nobody listens on (bound, then let go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        host, port = s.getsockname()[:2]
    return str(host), int(port)
