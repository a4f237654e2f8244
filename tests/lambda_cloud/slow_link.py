"""A TCP relay on 127.0.0.1 in front of the fake that holds chosen requests on their way to it: a
request slow to reach the server (a slow network), which an answer held inside the fake cannot
model now that the fake judges requests by the moment they reach its socket."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable


class SlowLink:
    """`hold(first bytes of a request)` says how many seconds to hold that request before any of
    it is passed on. Answers pass at once. `url(fake_url)` is the fake's URL through the link."""

    def __init__(self, port: int, hold: Callable[[bytes], float]) -> None:
        self.target, self.hold = port, hold
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, fake_url: str) -> str:
        return fake_url.replace(f":{self.target}/", f":{self.port}/")

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target))
                self._sockets += [client, server]
                threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                # A request starts with its method; its body (sent apart) queues behind it.
                if upstream and chunk.split(b" ", 1)[0] in (b"GET", b"POST", b"PATCH", b"DELETE"):
                    time.sleep(self.hold(chunk))
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
