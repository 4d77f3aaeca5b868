"""The stores of the fenced-write conformance suite, one `Kit` per kind: each makes
adapters with connections of their own, an adapter whose store is unreachable, a
write whose answer never reaches the writer, and (instance 2 of scripts/stores.sh,
or a server of its own) a restart, or says why the store cannot be restarted here
(`NOT_RESTARTABLE`). Also the HTTP servers the HTTP adapter talks to: wsgiref
(threaded) and uvicorn, each in a thread of this process."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import pytest

from cluster import REPOSITORY

from leasehold.fence import FenceError, FencedStore, Mode
from leasehold.fence.etcd import EtcdFence
from leasehold.fence.http import HttpFence, fenced_kv_asgi_app, fenced_kv_wsgi_app
from leasehold.fence.sqlite import SqliteFence

STORES_SCRIPT = REPOSITORY / "scripts" / "stores.sh"
#: The instance of scripts/stores.sh that the Python suite restarts (Rust's is 1).
RESTART_INSTANCE = 2
#: A loopback port nothing listens on: a store there is unreachable.
DEAD_PORT = 1
KINDS = ["postgres", "sqlite", "mysql", "redis", "etcd", "s3", "http-wsgi", "http-asgi"]
#: The fixture of instance 0 of each server store.
SHARED_URL_FIXTURE = {
    "postgres": "postgres_url",
    "mysql": "mariadb_url",
    "redis": "redis_url",
    "etcd": "etcd_url",
    "s3": "s3_url",
}
#: scripts/stores.sh's name of each server store.
STORE_NAME = {"postgres": "postgres", "mysql": "mariadb", "redis": "redis", "etcd": "etcd", "s3": "s3"}
#: The stores whose restart case cannot hold here, and why (the restart case skips them).
NOT_RESTARTABLE: Dict[str, str] = {
    "s3": "moto, the tests' S3 server, keeps everything in memory: a restarted moto is empty and has a new "
    "access key, so nothing written before a restart can survive it",
}


def stores_sh(command: str, name: str, instance: int = RESTART_INSTANCE) -> str:
    done = subprocess.run(
        [str(STORES_SCRIPT), command, name, str(instance)], capture_output=True, text=True, timeout=180
    )
    if done.returncode != 0:
        url = subprocess.run([str(STORES_SCRIPT), "url", name, str(instance)], capture_output=True, text=True)
        raise AssertionError(
            f"scripts/stores.sh {command} {name} {instance} failed:\n{done.stdout}{done.stderr}"
            f"{_sockets_on(port_of(url.stdout.strip()))}"
        )
    return done.stdout.strip()


def _sockets_on(port: int) -> str:
    """The sockets bound to 127.0.0.1:`port` (`ss`), to explain an "address in use"."""
    listed = subprocess.run(["ss", "-tanp", "state", "all", f"( sport = :{port} )"], capture_output=True, text=True)
    return f"sockets on 127.0.0.1:{port} (ss):\n{listed.stdout}{listed.stderr}"


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"))


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


# HTTP servers in threads.


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _ThreadingWsgiServer(ThreadingMixIn, WSGIServer):
    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (the lost-answer case)


class WsgiThread:
    """A threaded wsgiref server on 127.0.0.1, restartable on the same port."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self._app = app
        self.port = 0
        self._server: Optional[_ThreadingWsgiServer] = None
        self._thread: Optional[threading.Thread] = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = _ThreadingWsgiServer(("127.0.0.1", self.port), _QuietHandler)
        server.set_app(self._app)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None


class UvicornThread:
    """uvicorn serving an ASGI app on 127.0.0.1, on a socket that already listens (no
    wait for it to be ready), restartable on the same port."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self._app = app
        self.port = 0
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import uvicorn

        listener = socket.create_server(("127.0.0.1", self.port))
        self.port = listener.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            interface="asgi3",
            lifespan="on",
            loop="asyncio",
            http="h11",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            timeout_graceful_shutdown=10,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [listener]}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=60)
            assert not self._thread.is_alive(), "uvicorn did not stop"
            self._server = self._thread = None


# Losing an answer.


#: A chunk that holds only HTTP interim answers (`100 Continue`).
_INTERIM_ANSWERS = re.compile(rb"(HTTP/1\.[01] 100 [^\r\n]*\r\n\r\n)+")


class AnswerDropper:
    """A TCP proxy on 127.0.0.1 in front of `port`. Once armed, the first answer the
    server sends after the client sent `requests` more chunks is not forwarded: the
    proxy closes that connection both ways and stops listening (`keep_listening`: it
    closes only that connection, disarms, and forwards the connections that follow).
    `lost` is set then: the server had answered, so the request had taken effect.
    HTTP's interim `100 Continue` (an answer to `Expect: 100-continue`, after which the
    client sends the body) is forwarded and is not the answer."""

    def __init__(self, port: int, requests: int = 1, keep_listening: bool = False) -> None:
        self._target = ("127.0.0.1", port)
        self._requests = requests
        self._keep_listening = keep_listening
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sent_since_armed: Optional[int] = None
        self._sockets: List[socket.socket] = []
        self.lost = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        with self._lock:
            self._sent_since_armed = 0

    def _accept(self) -> None:
        while True:
            try:
                incoming, _ = self._listener.accept()
                outgoing = socket.create_connection(self._target, timeout=10)
                outgoing.settimeout(None)
            except OSError:
                return
            with self._lock:
                self._sockets += [incoming, outgoing]
            threading.Thread(target=self._pump, args=(incoming, outgoing, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(outgoing, incoming, True), daemon=True).start()

    def _pump(self, source: socket.socket, destination: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                with self._lock:
                    armed = self._sent_since_armed is not None
                    if armed and not answers:
                        self._sent_since_armed = (self._sent_since_armed or 0) + 1
                    drop = (
                        answers
                        and armed
                        and (self._sent_since_armed or 0) >= self._requests
                        and not _INTERIM_ANSWERS.fullmatch(data)
                    )
                    if drop:
                        self.lost.set()
                        if self._keep_listening:
                            self._sent_since_armed = None
                if drop:
                    if not self._keep_listening:
                        self.close()
                    return  # `finally` shuts this connection down both ways
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
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


# The kits.


class Kit:
    """One kind of store. `make` gives an adapter with a connection of its own, closed
    by `close`; `restart` restarts the store (restartable kits only)."""

    kind = ""
    #: The port of the store or service, for a proxy in front of it (None: no network).
    port: Optional[int] = None
    #: Round trips of an accepted write (the answer of the last one is lost).
    requests_per_write = 1

    def __init__(self) -> None:
        self._made: List[Any] = []

    def make(self) -> FencedStore:
        return self._keep(self._adapter(None))

    def make_via(self, port: int) -> FencedStore:
        """An adapter that reaches the store through 127.0.0.1:`port`."""
        return self._keep(self._adapter(port))

    def _adapter(self, port: Optional[int]) -> Any:
        raise NotImplementedError

    def unreachable(self) -> FencedStore:
        """An adapter whose store cannot be reached (a closed connection, a dead port)."""
        raise NotImplementedError

    def _keep(self, adapter: Any) -> FencedStore:
        self._made.append(adapter)
        return adapter  # type: ignore[no-any-return]

    def discard(self, adapter: FencedStore) -> None:
        """Closes the adapter's connection."""
        self._made.remove(adapter)
        adapter.close()  # type: ignore[attr-defined]

    def write_losing_answer(self, resource: str, token: int, mode: Mode, value: bytes) -> None:
        """Makes the write and loses its answer: through an `AnswerDropper`, the writer
        sees its connection fail after the store answered; without a network (SQLite),
        the writer drops the answer and closes its connection."""
        if self.port is None:
            writer = self.make()
            writer.write(resource, token, mode, value)
            self.discard(writer)
            return
        proxy = AnswerDropper(self.port, self.requests_per_write)
        try:
            writer = self.make_via(proxy.port)
            # Connects, and loads what a first write loads (Redis's script), before the write.
            writer.write(resource + " (warm-up)", 1, Mode.MANY_PER_GRANT, b"warm-up")
            proxy.arm()
            try:
                writer.write(resource, token, mode, value)
            except FenceError:
                pass
            else:
                raise AssertionError("the write answered although its answer was dropped")
            assert proxy.lost.is_set(), "the connection failed before the store answered"
            self.discard(writer)
        finally:
            proxy.close()

    def restart(self) -> None:
        raise NotImplementedError(f"{self.kind} is not restartable here")

    def close(self) -> None:
        made, self._made = self._made, []
        for adapter in made:
            adapter.close()


class PostgresKit(Kit):
    kind = "postgres"

    def __init__(self, url: str, instance: Optional[int] = None) -> None:
        super().__init__()
        from leasehold.fence.postgres import PostgresFence

        self._url, self.port, self._instance = url, port_of(url), instance
        with PostgresFence(url) as fence:
            fence.create_table()

    def _adapter(self, port: Optional[int]) -> Any:
        from leasehold.fence.postgres import PostgresFence

        return PostgresFence(self._url if port is None else with_port(self._url, port))

    def unreachable(self) -> FencedStore:
        import psycopg

        from leasehold.fence.postgres import PostgresFence

        connection = psycopg.connect(self._url, autocommit=True)
        connection.close()
        return PostgresFence(connection)

    def restart(self) -> None:
        assert self._instance is not None
        stores_sh("restart", "postgres", self._instance)


class MysqlKit(Kit):
    kind = "mysql"
    requests_per_write = 3  # a first write: UPDATE (no row yet), INSERT IGNORE, UPDATE

    def __init__(self, url: str, instance: Optional[int] = None) -> None:
        super().__init__()
        from leasehold.fence.mysql import MysqlFence

        self._url, self.port, self._instance = url, port_of(url), instance
        with MysqlFence(url) as fence:
            fence.create_table()

    def _adapter(self, port: Optional[int]) -> Any:
        from leasehold.fence.mysql import MysqlFence

        return MysqlFence(self._url if port is None else with_port(self._url, port))

    def unreachable(self) -> FencedStore:
        import pymysql

        from leasehold.fence.mysql import MysqlFence, connection_arguments

        connection = pymysql.connect(**connection_arguments(self._url), autocommit=True)
        connection.close()
        return MysqlFence(connection)

    def restart(self) -> None:
        assert self._instance is not None
        stores_sh("restart", "mariadb", self._instance)


class RedisKit(Kit):
    kind = "redis"

    def __init__(self, url: str, instance: Optional[int] = None) -> None:
        super().__init__()
        self._url, self.port, self._instance = url, port_of(url), instance

    def _adapter(self, port: Optional[int]) -> Any:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from leasehold.fence.redis import RedisFence

        if port is None:
            return RedisFence(self._url)
        # Through a proxy that drops an answer: no resending (redis-py's retry), so that
        # the writer sees the lost answer.
        return RedisFence(redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0)))

    def unreachable(self) -> FencedStore:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from leasehold.fence.redis import RedisFence

        return RedisFence(redis.Redis(host="127.0.0.1", port=DEAD_PORT, retry=Retry(NoBackoff(), 0)))

    def restart(self) -> None:
        assert self._instance is not None
        stores_sh("restart", "redis", self._instance)


class EtcdKit(Kit):
    kind = "etcd"

    def __init__(self, url: str, instance: Optional[int] = None) -> None:
        super().__init__()
        self._url, self.port, self._instance = url, port_of(url), instance

    def _adapter(self, port: Optional[int]) -> Any:
        return EtcdFence(self._url if port is None else with_port(self._url, port))

    def unreachable(self) -> FencedStore:
        return EtcdFence(f"http://127.0.0.1:{DEAD_PORT}")

    def restart(self) -> None:
        assert self._instance is not None
        stores_sh("restart", "etcd", self._instance)


class S3Kit(Kit):
    """`S3Fence.from_url` on the tests' S3 (moto): the adapter as a user makes it, with
    botocore's standard retries. Each test names resources of its own in the shared
    bucket `leasehold`."""

    kind = "s3"
    #: A GET, then the conditional PUT: its headers with `Expect: 100-continue`
    #: (botocore's, for every PutObject) and, after the `100 Continue`, its body.
    requests_per_write = 3

    def __init__(self, url: str, instance: Optional[int] = None) -> None:
        super().__init__()
        self._url, self.port, self._instance = url, port_of(url), instance

    def _adapter(self, port: Optional[int]) -> Any:
        from leasehold.fence.s3 import S3Fence

        return S3Fence.from_url(self._url if port is None else with_port(self._url, port))

    def unreachable(self) -> FencedStore:
        from leasehold.fence.s3 import S3Fence

        return self._keep(S3Fence.from_url(with_port(self._url, DEAD_PORT)))


class SqliteKit(Kit):
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path
        with SqliteFence(path) as fence:
            fence.create_table()

    def _adapter(self, port: Optional[int]) -> Any:
        assert port is None
        return SqliteFence(self._path)

    def unreachable(self) -> FencedStore:
        import sqlite3

        connection = sqlite3.connect(self._path)
        connection.close()
        return SqliteFence(connection)

    def restart(self) -> None:
        """Closes every connection to the file: the next adapter opens it anew."""
        made, self._made = self._made, []
        for adapter in made:
            adapter.close()


class HttpKit(Kit):
    """`HttpFence` against the fenced key-value service over `backing`, served by
    wsgiref (`asgi=False`) or uvicorn in a thread of this process."""

    def __init__(self, backing: Any, asgi: bool) -> None:
        super().__init__()
        self.kind = "http-asgi" if asgi else "http-wsgi"
        self._backing = backing
        self._server: Any = (
            UvicornThread(fenced_kv_asgi_app(backing)) if asgi else WsgiThread(fenced_kv_wsgi_app(backing))
        )
        self.port = self._server.port

    def _adapter(self, port: Optional[int]) -> Any:
        return HttpFence(self._server.url if port is None else f"http://127.0.0.1:{port}")

    def unreachable(self) -> FencedStore:
        return HttpFence(f"http://127.0.0.1:{DEAD_PORT}")

    def restart(self) -> None:
        """Stops the server and starts another on the same port over the same store."""
        self._server.stop()
        self._server.start()

    def close(self) -> None:
        super().close()
        self._server.stop()
        self._backing.close()


def server_kit(kind: str, url: str, instance: Optional[int] = None) -> Kit:
    kits = {"postgres": PostgresKit, "mysql": MysqlKit, "redis": RedisKit, "etcd": EtcdKit, "s3": S3Kit}
    return kits[kind](url, instance)  # type: ignore[no-any-return]


def shared_kit(kind: str, fixture: Callable[[str], str], directory: Path) -> Kit:
    """A kit over instance 0 of the stores (`fixture` names a URL fixture), a fresh
    SQLite file in `directory`, or an HTTP server of its own."""
    if kind == "sqlite":
        return SqliteKit(directory / "fence.sqlite3")
    if kind == "http-wsgi":
        sqlite_backing = SqliteFence(directory / "backing.sqlite3")
        sqlite_backing.create_table()
        return HttpKit(sqlite_backing, asgi=False)
    if kind == "http-asgi":
        from leasehold.fence.postgres import PostgresFence

        postgres_backing = PostgresFence(fixture("postgres_url"))
        postgres_backing.create_table()
        return HttpKit(postgres_backing, asgi=True)
    return server_kit(kind, fixture(SHARED_URL_FIXTURE[kind]))


def restartable_kit(kind: str, fixture: Callable[[str], str], directory: Path) -> Tuple[Kit, Callable[[], None]]:
    """A kit whose `restart` leaves the shared stores alone: instance 2 of a server
    store, started here (the returned function stops it), or a kit of `shared_kit`.
    Skips the test, before anything starts, for a store of `NOT_RESTARTABLE`."""
    if kind in NOT_RESTARTABLE:
        pytest.skip(f"{kind}: {NOT_RESTARTABLE[kind]}")
    if kind not in STORE_NAME:
        return shared_kit(kind, fixture, directory), lambda: None
    name = STORE_NAME[kind]
    stores_sh("start", name)
    try:
        kit = server_kit(kind, stores_sh("url", name), RESTART_INSTANCE)
    except BaseException:
        stores_sh("stop", name)
        raise

    def stop() -> None:
        stores_sh("stop", name)

    return kit, stop
