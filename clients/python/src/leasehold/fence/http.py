"""HTTP services: the fencing token travels in the `Leasehold-Fencing-Token` header, and
the service fences through any store of `leasehold.fence`.

* `headers(token, mode)` — the headers a client sends.
* `WsgiFenceLayer`, `AsgiFenceLayer` — server middleware. For a request that names a
  resource, the layer advances the fence in the store before the handler runs, and
  answers itself when it cannot: `428 Precondition Required` without a token header,
  `400` for a malformed or out-of-range token, mode or resource, `409 Conflict` with
  `Leasehold-Fencing-Token-Seen: <seen>` when a newer token holds the fence, `503` when
  the store fails. `Leasehold-Fence-Mode: once|many` chooses the mode (default: the
  layer's). The check and the handler's own write are two steps: where a request that
  passed the check must not be overtaken, the handler writes through the adapter with
  the token the layer hands it.
* `fenced_kv_wsgi_app`, `fenced_kv_asgi_app` — the fenced key-value service
  (docs/fenced-writes.md): `PUT /fenced/<resource>` with the value as the body is one
  fenced `write` with the request's token and mode (`204` or `409`); `POST
  /fenced/<resource>` (no body) goes through the layer and only advances the fence
  (`204` or `409`); `GET /fenced/<resource>` answers `200` with the value and the
  stored token in `Leasehold-Fencing-Token`, `204` with the token for a fence that was
  only advanced, or `404`. The resource is percent-encoded as one path segment.
* `HttpFence` — a `FencedStore` speaking that protocol, through urllib.
"""

from __future__ import annotations

import asyncio
import http
import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, MutableMapping, Optional, Tuple, Union
from urllib.parse import quote, unquote_to_bytes, urlsplit

from leasehold.fence import (
    _Adapter,
    Accepted,
    FencedStore,
    FenceError,
    FencingToken,
    FencingTokenError,
    Mode,
    Outcome,
    Record,
    Superseded,
    validate_mode,
    validate_resource,
    validate_token,
)

#: The request header that carries the token (`FencingToken.HEADER_NAME`).
TOKEN_HEADER = FencingToken.HEADER_NAME
#: The request header that chooses the mode: `once` or `many`.
FENCE_MODE_HEADER = "Leasehold-Fence-Mode"
#: The header of a `409 Conflict`: the token the store holds.
SEEN_HEADER = "Leasehold-Fencing-Token-Seen"
#: The path under which the fenced key-value service keeps its resources.
FENCED_PATH = "/fenced/"
#: Where the layer hands an accepted request's token (a `FencingToken`) and mode (a
#: `Mode`) to the handler: keys of the WSGI environ and of the ASGI scope.
TOKEN_KEY = "leasehold.fencing_token"
MODE_KEY = "leasehold.fence_mode"
#: The largest value the key-value service takes (`413` beyond).
MAX_VALUE_BYTES = 16 * 1024 * 1024
#: A refused WSGI request's body is read and dropped up to this size before the answer,
#: so that closing the connection does not reset it under the client's feet.
_DRAIN_BYTES = 1024 * 1024

WsgiEnviron = Dict[str, Any]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[WsgiEnviron, StartResponse], Iterable[bytes]]
AsgiScope = MutableMapping[str, Any]
AsgiReceive = Callable[[], Awaitable[MutableMapping[str, Any]]]
AsgiSend = Callable[[MutableMapping[str, Any]], Awaitable[None]]
AsgiApp = Callable[[AsgiScope, AsgiReceive, AsgiSend], Awaitable[None]]


def headers(token: Union[FencingToken, int], mode: Optional[Mode] = None) -> Dict[str, str]:
    """The headers that send `token` (and `mode`, if given) to a fenced service."""
    sent = {TOKEN_HEADER: validate_token(token).header_value()}
    if mode is not None:
        sent[FENCE_MODE_HEADER] = validate_mode(mode).value
    return sent


@dataclass(frozen=True)
class _Answer:
    """A response the layer or the service makes itself."""

    status: int
    headers: List[Tuple[str, str]]
    body: bytes = b""

    def wsgi_status(self) -> str:
        return f"{self.status} {http.HTTPStatus(self.status).phrase}"

    def wsgi_headers(self) -> List[Tuple[str, str]]:
        return [*self.headers, ("Content-Length", str(len(self.body)))]

    def asgi_headers(self) -> List[Tuple[bytes, bytes]]:
        return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in self.wsgi_headers()]


def _plain(status: int, text: str, extra: Iterable[Tuple[str, str]] = ()) -> _Answer:
    return _Answer(status, [("Content-Type", "text/plain; charset=utf-8"), *extra], (text + "\n").encode("utf-8"))


def _superseded(outcome: Superseded) -> _Answer:
    return _plain(
        409, f"superseded: the store holds fencing token {outcome.seen}", [(SEEN_HEADER, outcome.seen.header_value())]
    )


def _parse(
    resource: str, tokens: List[str], modes: List[str], default: Mode
) -> Union[_Answer, Tuple[str, FencingToken, Mode]]:
    """The request's resource, token and mode, or the answer that refuses it."""
    try:
        resource = validate_resource(resource)
    except FenceError as error:
        return _plain(400, f"bad resource: {error}")
    if not tokens:
        return _plain(428, f"a fenced request needs the {TOKEN_HEADER} header")
    if len(tokens) > 1:
        return _plain(400, f"more than one {TOKEN_HEADER} header")
    try:
        token = validate_token(FencingToken.from_header_value(tokens[0]))
    except FencingTokenError as error:
        return _plain(400, f"bad {TOKEN_HEADER}: {error}")
    if not modes:
        return resource, token, default
    if len(modes) > 1:
        return _plain(400, f"more than one {FENCE_MODE_HEADER} header")
    try:
        mode = Mode(modes[0].strip())
    except ValueError:
        return _plain(400, f"bad {FENCE_MODE_HEADER}: {modes[0]!r} (once or many)")
    return resource, token, mode


def _advance(store: FencedStore, resource: str, token: FencingToken, mode: Mode) -> Optional[_Answer]:
    """None when the store took the token, else the answer that refuses the request."""
    try:
        outcome = store.advance(resource, token, mode)
    except FenceError as error:
        return _plain(503, f"the fence store failed: {error}")
    if isinstance(outcome, Superseded):
        return _superseded(outcome)
    return None


def _wsgi_header(environ: WsgiEnviron, name: str) -> List[str]:
    value = environ.get("HTTP_" + name.upper().replace("-", "_"))
    return [] if value is None else [value]


def _drain(environ: WsgiEnviron) -> None:
    """Reads and drops a small request body that nobody will read."""
    try:
        remaining = int(environ.get("CONTENT_LENGTH") or 0)
        if 0 < remaining <= _DRAIN_BYTES:
            stream = environ["wsgi.input"]
            while remaining > 0:
                chunk = stream.read(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)
    except (ValueError, OSError):
        pass


def _respond_wsgi(start_response: StartResponse, answer: _Answer) -> List[bytes]:
    start_response(answer.wsgi_status(), answer.wsgi_headers())
    return [answer.body]


class WsgiFenceLayer:
    """WSGI middleware that fences requests before `app` runs.

    `resource(environ)` names the resource a request writes, or None to let it pass
    unchecked (reads, say). For a named one the layer advances the fence in `store`
    with the request's token and mode (default `mode`) and answers 428, 400, 409 or
    503 itself (see the module); an accepted request reaches `app` with the token in
    `environ["leasehold.fencing_token"]` (a `FencingToken`) and the mode in
    `environ["leasehold.fence_mode"]`. The store call blocks the worker thread.
    """

    def __init__(
        self,
        app: WsgiApp,
        store: FencedStore,
        resource: Callable[[WsgiEnviron], Optional[str]],
        mode: Mode = Mode.MANY_PER_GRANT,
    ) -> None:
        self._app = app
        self._store = store
        self._resource = resource
        self._mode = validate_mode(mode)

    def __call__(self, environ: WsgiEnviron, start_response: StartResponse) -> Iterable[bytes]:
        resource = self._resource(environ)
        if resource is None:
            return self._app(environ, start_response)
        parsed = _parse(
            resource, _wsgi_header(environ, TOKEN_HEADER), _wsgi_header(environ, FENCE_MODE_HEADER), self._mode
        )
        refusal = parsed if isinstance(parsed, _Answer) else _advance(self._store, *parsed)
        if refusal is not None:
            _drain(environ)
            return _respond_wsgi(start_response, refusal)
        assert not isinstance(parsed, _Answer)
        environ[TOKEN_KEY] = parsed[1]
        environ[MODE_KEY] = parsed[2]
        return self._app(environ, start_response)


def _asgi_header(scope: AsgiScope, name: str) -> List[str]:
    wanted = name.lower().encode("latin-1")
    return [value.decode("latin-1") for key, value in scope.get("headers", []) if key.lower() == wanted]


async def _respond_asgi(send: AsgiSend, answer: _Answer) -> None:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.asgi_headers()})
    await send({"type": "http.response.body", "body": answer.body})


class AsgiFenceLayer:
    """ASGI middleware that fences HTTP requests before `app` runs (other scopes pass).

    `resource(scope)` names the resource a request writes, or None to let it pass
    unchecked. For a named one the layer advances the fence in `store` (in a worker
    thread: the adapters block) with the request's token and mode (default `mode`) and
    answers 428, 400, 409 or 503 itself (see the module); an accepted request reaches
    `app` with the token in `scope["leasehold.fencing_token"]` (a `FencingToken`) and
    the mode in `scope["leasehold.fence_mode"]`, in a copy of the scope.
    """

    def __init__(
        self,
        app: AsgiApp,
        store: FencedStore,
        resource: Callable[[AsgiScope], Optional[str]],
        mode: Mode = Mode.MANY_PER_GRANT,
    ) -> None:
        self._app = app
        self._store = store
        self._resource = resource
        self._mode = validate_mode(mode)

    async def __call__(self, scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        resource = self._resource(scope) if scope["type"] == "http" else None
        if resource is None:
            await self._app(scope, receive, send)
            return
        parsed = _parse(resource, _asgi_header(scope, TOKEN_HEADER), _asgi_header(scope, FENCE_MODE_HEADER), self._mode)
        if isinstance(parsed, _Answer):
            await _respond_asgi(send, parsed)
            return
        refusal = await asyncio.get_running_loop().run_in_executor(None, _advance, self._store, *parsed)
        if refusal is not None:
            await _respond_asgi(send, refusal)
            return
        fenced = dict(scope)
        fenced[TOKEN_KEY] = parsed[1]
        fenced[MODE_KEY] = parsed[2]
        await self._app(fenced, receive, send)


# The fenced key-value service.


def _resource_in_path(path: bytes) -> Union[str, _Answer]:
    """The resource of a decoded request path `/fenced/<resource>`, or the answer."""
    if not path.startswith(FENCED_PATH.encode("ascii")):
        return _plain(404, f"not found: resources live under {FENCED_PATH}")
    try:
        return validate_resource(path[len(FENCED_PATH) :].decode("utf-8"))
    except UnicodeDecodeError:
        return _plain(400, "bad resource: not UTF-8")
    except FenceError as error:
        return _plain(400, f"bad resource: {error}")


def _wsgi_resource(environ: WsgiEnviron) -> Union[str, _Answer]:
    # PEP 3333: PATH_INFO holds the decoded path's bytes as latin-1 characters.
    return _resource_in_path(environ.get("PATH_INFO", "").encode("latin-1"))


def _asgi_resource(scope: AsgiScope) -> Union[str, _Answer]:
    raw = scope.get("raw_path")
    path = unquote_to_bytes(raw) if raw else scope.get("path", "").encode("utf-8")
    return _resource_in_path(path)


def _kv_answer(
    store: FencedStore,
    method: str,
    resource: str,
    token: Optional[FencingToken],
    mode: Mode,
    body: Optional[bytes],
) -> _Answer:
    """What the key-value service answers: a PUT is one fenced `write` (its token and
    mode parsed from its headers), so the fence never moves without the value; a POST
    was already fenced by the layer."""
    try:
        if method == "GET":
            record = store.read(resource)
            if record is None:
                return _plain(404, "no such resource")
            fence = [(TOKEN_HEADER, record.token.header_value())]
            if record.value is None:
                return _Answer(204, fence)
            return _Answer(200, [("Content-Type", "application/octet-stream"), *fence], record.value)
        if token is None:
            return _plain(500, "the request was not fenced (the service runs without its layer)")
        if method == "POST":
            return _Answer(204, [])
        assert body is not None
        outcome = store.write(resource, token, mode, body)
    except FenceError as error:
        return _plain(503, f"the fence store failed: {error}")
    return _superseded(outcome) if isinstance(outcome, Superseded) else _Answer(204, [])


def _not_allowed() -> _Answer:
    return _plain(405, "method not allowed", [("Allow", "GET, PUT, POST")])


def _fenced_method(method: str) -> bool:
    """Only a POST goes through the layer: a PUT is fenced by its one `write`."""
    return method == "POST"


def fenced_kv_wsgi_app(
    store: FencedStore, mode: Mode = Mode.MANY_PER_GRANT, max_value: int = MAX_VALUE_BYTES
) -> WsgiApp:
    """The fenced key-value service as a WSGI application, over `store` (which must be
    usable from the server's threads). `mode` is the layer's default mode."""

    def service(environ: WsgiEnviron, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        resource = _wsgi_resource(environ)
        if isinstance(resource, _Answer) or method not in ("GET", "PUT", "POST"):
            _drain(environ)
            return _respond_wsgi(start_response, resource if isinstance(resource, _Answer) else _not_allowed())
        body: Optional[bytes] = None
        token, request_mode = environ.get(TOKEN_KEY), environ.get(MODE_KEY, mode)
        if method == "PUT":
            parsed = _parse(
                resource, _wsgi_header(environ, TOKEN_HEADER), _wsgi_header(environ, FENCE_MODE_HEADER), mode
            )
            if isinstance(parsed, _Answer):
                _drain(environ)
                return _respond_wsgi(start_response, parsed)
            _, token, request_mode = parsed
            read = _read_wsgi_body(environ, max_value)
            if isinstance(read, _Answer):
                return _respond_wsgi(start_response, read)
            body = read
        else:
            _drain(environ)
        return _respond_wsgi(start_response, _kv_answer(store, method, resource, token, request_mode, body))

    def fenced_resource(environ: WsgiEnviron) -> Optional[str]:
        if not _fenced_method(environ["REQUEST_METHOD"]):
            return None
        resource = _wsgi_resource(environ)
        return resource if isinstance(resource, str) else None

    return WsgiFenceLayer(service, store, fenced_resource, mode)


def _read_wsgi_body(environ: WsgiEnviron, max_value: int) -> Union[bytes, _Answer]:
    length_text = environ.get("CONTENT_LENGTH") or ""
    if not length_text:
        if environ.get("HTTP_TRANSFER_ENCODING"):
            return _plain(411, "send the value with a Content-Length")
        return b""
    if not length_text.isdigit():
        return _plain(400, "bad Content-Length")
    length = int(length_text)
    if length > max_value:
        return _plain(413, f"a value is at most {max_value} bytes")
    stream = environ["wsgi.input"]
    chunks = []
    while length > 0:
        chunk = stream.read(min(length, 65536))
        if not chunk:
            return _plain(400, "the body ended before its Content-Length")
        chunks.append(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def fenced_kv_asgi_app(
    store: FencedStore, mode: Mode = Mode.MANY_PER_GRANT, max_value: int = MAX_VALUE_BYTES
) -> AsgiApp:
    """The fenced key-value service as an ASGI application, over `store` (called in
    worker threads). `mode` is the layer's default mode."""

    async def service(scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method = scope["method"]
        resource = _asgi_resource(scope)
        if isinstance(resource, _Answer) or method not in ("GET", "PUT", "POST"):
            await _respond_asgi(send, resource if isinstance(resource, _Answer) else _not_allowed())
            return
        body: Optional[bytes] = None
        token, request_mode = scope.get(TOKEN_KEY), scope.get(MODE_KEY, mode)
        if method == "PUT":
            parsed = _parse(resource, _asgi_header(scope, TOKEN_HEADER), _asgi_header(scope, FENCE_MODE_HEADER), mode)
            if isinstance(parsed, _Answer):
                await _respond_asgi(send, parsed)
                return
            _, token, request_mode = parsed
            read = await _read_asgi_body(receive, max_value)
            if read is None:
                return  # the client went away
            if isinstance(read, _Answer):
                await _respond_asgi(send, read)
                return
            body = read
        answer = await asyncio.get_running_loop().run_in_executor(
            None, _kv_answer, store, method, resource, token, request_mode, body
        )
        await _respond_asgi(send, answer)

    def fenced_resource(scope: AsgiScope) -> Optional[str]:
        if not _fenced_method(scope["method"]):
            return None
        resource = _asgi_resource(scope)
        return resource if isinstance(resource, str) else None

    return AsgiFenceLayer(service, store, fenced_resource, mode)


async def _read_asgi_body(receive: AsgiReceive, max_value: int) -> Union[bytes, _Answer, None]:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_value:
            return _plain(413, f"a value is at most {max_value} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _lifespan(receive: AsgiReceive, send: AsgiSend) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# The client.


class HttpFence(_Adapter):
    """A `FencedStore` over the fenced key-value service at `base_url` (the service's
    root: `PUT {base_url}/fenced/<resource>`). `write` is a PUT, `advance` a POST,
    `read` a GET; every request is a connection of its own (urllib), with `headers`
    added. Answers other than the protocol's, and an unreachable service, raise
    `FenceError`.
    """

    def __init__(self, base_url: str, timeout: float = 10.0, headers: Optional[Mapping[str, str]] = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise FenceError(f"{base_url!r} is not a service URL (http://host:port[/path])")
        self._base = base_url.rstrip("/")
        self._timeout = timeout
        self._headers = dict(headers or {})

    def url(self, resource: str) -> str:
        """The resource's URL: its name percent-encoded (a `/` too) under `/fenced/`."""
        return self._base + FENCED_PATH + quote(validate_resource(resource), safe="")

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        """A `PUT` of the value, or for `advance` a `POST`: `204` accepted, `409` superseded."""
        return (
            self._send("PUT", resource, token, mode, value)
            if value is not None
            else self._send("POST", resource, token, mode, b"")
        )

    def _send(self, method: str, resource: str, token: FencingToken, mode: Mode, body: bytes) -> Outcome:
        sent = {**headers(token, mode), "Content-Type": "application/octet-stream"}
        status, answer_headers, answer = self._request(method, self.url(resource), body, sent)
        if status in (200, 204):
            return Accepted()
        if status == 409:
            try:
                seen = FencingToken.from_header_value(answer_headers.get(SEEN_HEADER, ""))
            except FencingTokenError:
                raise FenceError(f"{method} {resource!r} answered 409 without a valid {SEEN_HEADER}") from None
            return Superseded(seen=seen, ours=token)
        raise FenceError(f"{method} {resource!r} answered {status}: {_excerpt(answer)}")

    def read(self, resource: str) -> Optional[Record]:
        """`GET`: `200` the value and token, `204` a token without a value, `404` nothing."""
        status, answer_headers, answer = self._request("GET", self.url(resource), None, {})
        if status == 404:
            return None
        if status not in (200, 204):
            raise FenceError(f"GET {resource!r} answered {status}: {_excerpt(answer)}")
        try:
            token = FencingToken.from_header_value(answer_headers.get(TOKEN_HEADER, ""))
        except FencingTokenError:
            raise FenceError(f"GET {resource!r} answered {status} without a valid {TOKEN_HEADER}") from None
        return Record(token, answer if status == 200 else None)

    def _request(
        self, method: str, url: str, body: Optional[bytes], sent: Mapping[str, str]
    ) -> Tuple[int, Message, bytes]:
        request = urllib.request.Request(url, data=body, headers={**self._headers, **sent}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            try:
                return error.code, error.headers, error.read()
            except (http.client.HTTPException, OSError) as lost:
                raise FenceError(f"{method} {url} answered {error.code}, then the connection failed: {lost}") from lost
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            raise FenceError(f"{method} {url} failed: {error!r}") from error

    def close(self) -> None:
        """Nothing to close: every call is a request of its own."""


def _excerpt(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace").strip()
