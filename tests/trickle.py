"""A loopback server that never finishes an answer: for the clients whose reads are each bounded (httpx's timeout)
but whose whole wait must be too (launch's readiness check, stop's unload)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def trickling(headers: bool = False) -> Iterator[int]:
    """A port whose server sends an event stream's headers, then a keep-alive comment twice a second, for ever
    (`headers`: its status line, then a header line twice a second, for ever); it ends with the block."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n" if headers else
                         b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            while not stop.wait(0.5):
                conn.sendall(b"X-Held: 1\r\n" if headers else b"3\r\n:\n\n\r\n")

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
