"""The HTTP fence layer (WSGI and ASGI middleware) and the fenced key-value service,
over real HTTP: wsgiref and uvicorn in threads, the fence in an SQLite file."""

from __future__ import annotations

import http.client
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from fence_kits import UvicornThread, WsgiThread

from leasehold.fence import FenceTokenError, FencingToken, Mode
from leasehold.fence.http import (
    FENCE_MODE_HEADER,
    MODE_KEY,
    SEEN_HEADER,
    TOKEN_HEADER,
    TOKEN_KEY,
    AsgiFenceLayer,
    AsgiReceive,
    AsgiScope,
    AsgiSend,
    WsgiFenceLayer,
    fenced_kv_asgi_app,
    fenced_kv_wsgi_app,
    headers,
)
from leasehold.fence.sqlite import SqliteFence

#: A body sent with refused requests too: the layer answers before the app reads it.
BODY = b"b" * 10_000


@dataclass
class Answer:
    status: int
    headers: Dict[str, str]
    body: bytes


def request(
    port: int, method: str, path: str, sent: Sequence[Tuple[str, str]] = (), body: Optional[bytes] = None
) -> Answer:
    """One request on a connection of its own; `sent` may repeat a header."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in sent:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Answer(response.status, {name.lower(): value for name, value in response.getheaders()}, response.read())
    finally:
        connection.close()


def describe(token: Any, mode: Any) -> bytes:
    """What the handler saw."""
    return f"{type(token).__name__} {token} {getattr(mode, 'value', mode)}".encode()


class Handled:
    """The requests that reached the app behind the layer."""

    def __init__(self) -> None:
        self.paths: List[str] = []


def wsgi_service(store: SqliteFence, handled: Handled) -> Any:
    def app(environ: Dict[str, Any], start_response: Any) -> List[bytes]:
        handled.paths.append(environ["PATH_INFO"])
        body = describe(environ.get(TOKEN_KEY), environ.get(MODE_KEY))
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    def resource(environ: Dict[str, Any]) -> Optional[str]:
        path = environ["PATH_INFO"]
        return path[1:] if path.startswith("/items/") else None

    return WsgiFenceLayer(app, store, resource, mode=Mode.ONCE_PER_GRANT)


def asgi_service(store: SqliteFence, handled: Handled) -> Any:
    async def app(scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] != "http":
            return
        handled.paths.append(scope["path"])
        body = describe(scope.get(TOKEN_KEY), scope.get(MODE_KEY))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})

    def resource(scope: AsgiScope) -> Optional[str]:
        path = scope["path"]
        return path[1:] if path.startswith("/items/") else None

    return AsgiFenceLayer(app, store, resource, mode=Mode.ONCE_PER_GRANT)


@dataclass
class Served:
    port: int
    handled: Handled
    store: SqliteFence


@pytest.fixture(params=["wsgi", "asgi"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """An app behind the layer (default mode: once per grant): `/items/<x>` is the
    fenced resource `items/<x>`, every other path passes."""
    store = SqliteFence(tmp_path / "layer.sqlite3")
    store.create_table()
    handled = Handled()
    server: Any = (
        WsgiThread(wsgi_service(store, handled))
        if request.param == "wsgi"
        else UvicornThread(asgi_service(store, handled))
    )
    try:
        yield Served(server.port, handled, store)
    finally:
        server.stop()
        store.close()


def test_the_client_headers() -> None:
    assert headers(5) == {"Leasehold-Fencing-Token": "5"}
    assert headers(FencingToken(6), Mode.ONCE_PER_GRANT) == {
        "Leasehold-Fencing-Token": "6",
        "Leasehold-Fence-Mode": "once",
    }
    for bad in [0, 2**63]:
        with pytest.raises(FenceTokenError):
            headers(bad)


def test_a_request_without_a_resource_passes_unchecked(served: Served) -> None:
    answer = request(served.port, "POST", "/open", body=BODY)
    assert answer.status == 200 and answer.body == b"NoneType None None"
    assert served.handled.paths == ["/open"]


def test_a_fenced_request_without_a_token_is_428(served: Served) -> None:
    answer = request(served.port, "PUT", "/items/a", body=BODY)
    assert answer.status == 428 and TOKEN_HEADER.encode() in answer.body
    assert served.handled.paths == [] and served.store.read("items/a") is None


@pytest.mark.parametrize(
    "sent",
    [
        [(TOKEN_HEADER, "abc")],
        [(TOKEN_HEADER, "-1")],
        [(TOKEN_HEADER, "+1")],
        [(TOKEN_HEADER, "1.5")],
        [(TOKEN_HEADER, "0x10")],
        [(TOKEN_HEADER, "")],
        [(TOKEN_HEADER, "1 2")],
        [(TOKEN_HEADER, "0")],
        [(TOKEN_HEADER, str(2**63))],
        [(TOKEN_HEADER, str(2**64))],
        [(TOKEN_HEADER, "5"), (TOKEN_HEADER, "6")],
        [(TOKEN_HEADER, "5"), (FENCE_MODE_HEADER, "sometimes")],
        [(TOKEN_HEADER, "5"), (FENCE_MODE_HEADER, "")],
    ],
    ids=lambda sent: " ".join(f"{name[10:]}={value!r}" for name, value in sent),
)
def test_a_malformed_or_out_of_range_token_or_mode_is_400(served: Served, sent: List[Tuple[str, str]]) -> None:
    answer = request(served.port, "PUT", "/items/a", sent, body=BODY)
    assert answer.status == 400, answer
    assert served.handled.paths == [] and served.store.read("items/a") is None


def test_an_accepted_request_hands_the_handler_its_token(served: Served) -> None:
    answer = request(served.port, "PUT", "/items/a", [(TOKEN_HEADER, " 9223372036854775806 ")], body=BODY)
    assert answer.status == 200 and answer.body == b"FencingToken 9223372036854775806 once"
    answer = request(served.port, "PUT", "/items/b", [(TOKEN_HEADER, "5"), (FENCE_MODE_HEADER, "many")], body=BODY)
    assert answer.status == 200 and answer.body == b"FencingToken 5 many"
    assert served.handled.paths == ["/items/a", "/items/b"]
    fenced = served.store.read("items/b")
    assert fenced is not None and fenced.token == FencingToken(5) and fenced.value is None


def test_a_superseded_request_is_409_with_the_token_seen(served: Served) -> None:
    assert request(served.port, "PUT", "/items/c", [(TOKEN_HEADER, "7")], body=BODY).status == 200
    older = request(served.port, "PUT", "/items/c", [(TOKEN_HEADER, "6"), (FENCE_MODE_HEADER, "many")], body=BODY)
    assert older.status == 409 and older.headers[SEEN_HEADER.lower()] == "7"
    # The layer's mode is once per grant: the same token again is refused, unless the
    # client asks for many.
    same = request(served.port, "PUT", "/items/c", [(TOKEN_HEADER, "7")], body=BODY)
    assert same.status == 409 and same.headers[SEEN_HEADER.lower()] == "7"
    many = request(served.port, "PUT", "/items/c", [(TOKEN_HEADER, "7"), (FENCE_MODE_HEADER, "many")], body=BODY)
    assert many.status == 200 and many.body == b"FencingToken 7 many"
    assert served.handled.paths == ["/items/c", "/items/c"]


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_store_that_fails_is_503(kind: str, tmp_path: Path) -> None:
    closed = sqlite3.connect(tmp_path / "closed.sqlite3")
    closed.close()
    store = SqliteFence(closed)
    handled = Handled()
    server: Any = (
        WsgiThread(wsgi_service(store, handled)) if kind == "wsgi" else UvicornThread(asgi_service(store, handled))
    )
    try:
        answer = request(server.port, "PUT", "/items/a", [(TOKEN_HEADER, "5")], body=BODY)
        assert answer.status == 503 and handled.paths == []
    finally:
        server.stop()


@pytest.fixture(params=["wsgi", "asgi"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[int]:
    """The fenced key-value service (values of at most 64 KiB); its port."""
    store = SqliteFence(tmp_path / "kv.sqlite3")
    store.create_table()
    server: Any = (
        WsgiThread(fenced_kv_wsgi_app(store, max_value=65536))
        if request.param == "wsgi"
        else UvicornThread(fenced_kv_asgi_app(store, max_value=65536))
    )
    try:
        yield server.port
    finally:
        server.stop()
        store.close()


def test_the_key_value_service(kv: int) -> None:
    path = "/fenced/orders%2F42%20%C3%BC"  # orders/42 ü
    assert request(kv, "GET", path).status == 404
    assert request(kv, "PUT", path, body=b"v1").status == 428
    assert request(kv, "PUT", path, [(TOKEN_HEADER, "5")], body=b"v1").status == 204
    got = request(kv, "GET", path)
    assert (got.status, got.body, got.headers[TOKEN_HEADER.lower()]) == (200, b"v1", "5")
    stale = request(kv, "PUT", path, [(TOKEN_HEADER, "4")], body=b"v0")
    assert stale.status == 409 and stale.headers[SEEN_HEADER.lower()] == "5"
    assert request(kv, "POST", path, [(TOKEN_HEADER, "6"), (FENCE_MODE_HEADER, "once")]).status == 204
    got = request(kv, "GET", path)
    assert (got.status, got.body, got.headers[TOKEN_HEADER.lower()]) == (200, b"v1", "6")
    advanced = "/fenced/only-advanced"
    assert request(kv, "POST", advanced, [(TOKEN_HEADER, "3")]).status == 204
    got = request(kv, "GET", advanced)
    assert (got.status, got.body, got.headers[TOKEN_HEADER.lower()]) == (204, b"", "3")


def test_the_key_value_service_refuses_what_is_not_its_protocol(kv: int) -> None:
    assert request(kv, "GET", "/elsewhere").status == 404
    not_allowed = request(kv, "DELETE", "/fenced/a", [(TOKEN_HEADER, "5")])
    assert not_allowed.status == 405 and not_allowed.headers["allow"] == "GET, PUT, POST"
    assert request(kv, "GET", "/fenced/").status == 400
    assert request(kv, "GET", "/fenced/%FF").status == 400
    assert request(kv, "PUT", "/fenced/" + "x" * 513, [(TOKEN_HEADER, "5")], body=b"v").status == 400
    assert request(kv, "PUT", "/fenced/big", [(TOKEN_HEADER, "5")], body=b"x" * 65537).status == 413
