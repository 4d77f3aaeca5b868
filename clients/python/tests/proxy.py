"""A TCP proxy on loopback in front of one node, that can be cut: a network partition
between one client and the cluster, while the cluster itself runs on.

While cut, the proxy forwards nothing in either direction and new connections are
accepted but never connected onward (a black hole: the client sees no error, only
silence, as behind a dead link). Healing forwards what was held back.
"""

from __future__ import annotations

import socket
import threading
from typing import List, Tuple

from cluster import free_ports

#: Bytes read from a socket at a time.
CHUNK_BYTES = 65_536


class Proxy:
    """Forwards 127.0.0.1:`port` to `target` ("host:port")."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target: Tuple[str, int] = (host, int(port))
        [self.port] = free_ports(1)
        self.address = f"127.0.0.1:{self.port}"
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open = threading.Event()
        self._open.set()
        self._stopped = False
        self._sockets: List[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def cut(self) -> None:
        """From now on nothing passes, either way."""
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                incoming, _ = self._listener.accept()
            except OSError:
                return
            self._keep(incoming)
            threading.Thread(target=self._connect, args=(incoming,), daemon=True).start()

    def _connect(self, incoming: socket.socket) -> None:
        self._open.wait()
        if self._stopped:
            return
        try:
            outgoing = socket.create_connection(self._target, timeout=5)
            outgoing.settimeout(None)
        except OSError:
            incoming.close()
            return
        self._keep(outgoing)
        for source, destination in ((incoming, outgoing), (outgoing, incoming)):
            threading.Thread(target=self._pump, args=(source, destination), daemon=True).start()

    def _pump(self, source: socket.socket, destination: socket.socket) -> None:
        try:
            while True:
                data = source.recv(CHUNK_BYTES)
                if not data:
                    break
                self._open.wait()  # Held back while cut.
                if self._stopped:
                    break
                destination.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, destination):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stopped = True
        self._open.set()
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass
