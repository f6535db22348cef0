"""A TCP proxy for token-channel tests: records every byte each way (`seen`) and cuts the connections it
carries on demand (`drop`: both ends see the connection die, as when a middlebox drops it; the
client's next connection goes through again)."""

import socket
import threading


class Proxy:
    def __init__(self, target_port: int):
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.target = target_port
        self.seen = bytearray()
        self.accepted = 0  # client connections so far
        self._live: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self._live += [c, u]
                self.accepted += 1
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        while True:
            try:
                data = a.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._cut(a, b)
                return
            self.seen += data
            try:
                b.sendall(data)
            except OSError:
                self._cut(a, b)
                return

    @staticmethod
    def _cut(*socks):
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self):
        """Cut every connection carried now (the proxy keeps accepting new ones)."""
        with self._lock:
            live, self._live = self._live, []
        self._cut(*live)

    def close(self):
        self.srv.close()
        self.drop()
