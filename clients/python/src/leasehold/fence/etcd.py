"""etcd (3.4 or newer), through its JSON gateway and urllib: no etcd library. The fence
is the keys `leasehold/fence/<resource>/token` (20 decimal digits, zero-padded; etcd
compares values as bytes) and `…/value`, checked and written by one transaction::

    if create_revision(token key) == 0:            put token, put value   (first write)
    else: if value(token key) < ours:              put token, put value   (once per grant)
          else:                                    range token key        (refused: seen)
       or if value(token key) > ours:              range token key        (many per grant)
          else:                                    put token, put value

Linearizable, durable once acknowledged (a quorum's fsync); one `Txn` round trip, one
Raft entry. The gateway (`POST /v3/kv/txn`) speaks protobuf's JSON with proto field
names: keys and values in base64, 64-bit integers as strings, enums by name, and
fields at their default value left out (a failed transaction has no `succeeded`, an
empty value no `value`).
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit

from leasehold.fence import (
    _Adapter,
    Accepted,
    FenceError,
    FencingToken,
    Mode,
    Outcome,
    Record,
    Superseded,
    _padded,
    _unpadded,
    validate_resource,
)

#: The prefix of the fences' keys (docs/fenced-writes.md).
DEFAULT_PREFIX = "leasehold/fence/"


def _b64(data: Union[str, bytes]) -> str:
    return base64.b64encode(data.encode("utf-8") if isinstance(data, str) else data).decode("ascii")


def _put(key: str, value: Union[str, bytes]) -> Dict[str, Any]:
    return {"request_put": {"key": _b64(key), "value": _b64(value)}}


def _range(key: str) -> Dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


class EtcdFence(_Adapter):
    """Fenced writes to etcd keys, through the gRPC gateway at `url`
    (`http://host:2379`; https too). `prefix` goes before the resource in the keys;
    `headers` are sent with every request (an `Authorization` token, say). Each call
    is one HTTP request; the adapter is thread-safe. Store failures (unreachable,
    refused requests, answers that are not etcd's) raise `FenceError`.
    """

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 10.0,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise FenceError(f"{url!r} is not an etcd URL (http://host:port)")
        if not isinstance(prefix, str):
            raise FenceError("a key prefix is a str")
        self._url = url.rstrip("/")
        self._prefix = prefix
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json", **(headers or {})}

    def keys(self, resource: str) -> Tuple[str, str]:
        """The resource's token key and value key."""
        resource = validate_resource(resource)
        return f"{self._prefix}{resource}/token", f"{self._prefix}{resource}/value"

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        token_key, value_key = self.keys(resource)
        ours = _padded(token)
        puts = [_put(token_key, ours)] + ([] if value is None else [_put(value_key, value)])
        read = [_range(token_key)]
        compare_value = {"target": "VALUE", "key": _b64(token_key), "value": _b64(ours)}
        if mode is Mode.ONCE_PER_GRANT:
            nested = {"compare": [{**compare_value, "result": "LESS"}], "success": puts, "failure": read}
        else:
            nested = {"compare": [{**compare_value, "result": "GREATER"}], "success": read, "failure": puts}
        answer = self._call(
            "/v3/kv/txn",
            {
                "compare": [{"target": "CREATE", "key": _b64(token_key), "result": "EQUAL", "create_revision": "0"}],
                "success": puts,
                "failure": [{"request_txn": nested}],
            },
        )
        if answer.get("succeeded", False):
            return Accepted()
        inner = _response(answer, 0, "response_txn")
        refused = not inner.get("succeeded", False) if mode is Mode.ONCE_PER_GRANT else inner.get("succeeded", False)
        if not refused:
            return Accepted()
        kvs = _response(inner, 0, "response_range").get("kvs") or []
        if len(kvs) != 1:
            raise FenceError(f"etcd refused the write to {resource!r} but read no token: {answer!r}")
        return Superseded(seen=_unpadded(_value(kvs[0]), f"etcd key {token_key!r}"), ours=token)

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value (one transaction of two ranges), or None."""
        token_key, value_key = self.keys(resource)
        answer = self._call("/v3/kv/txn", {"success": [_range(token_key), _range(value_key)]})
        token_kvs = _response(answer, 0, "response_range").get("kvs") or []
        value_kvs = _response(answer, 1, "response_range").get("kvs") or []
        if not token_kvs:
            return None
        token = _unpadded(_value(token_kvs[0]), f"etcd key {token_key!r}")
        return Record(token, _value(value_kvs[0]) if value_kvs else None)

    def _call(self, path: str, body: Mapping[str, Any]) -> Dict[str, Any]:
        request = urllib.request.Request(
            self._url + path, data=json.dumps(body).encode("utf-8"), headers=self._headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            try:
                detail = error.read().decode("utf-8", "replace")[:500]
            except (http.client.HTTPException, OSError):
                detail = ""
            raise FenceError(f"etcd answered {error.code} to {path}: {detail}") from error
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            raise FenceError(f"etcd at {self._url} failed: {error!r}") from error
        try:
            answer = json.loads(data)
        except ValueError as error:
            raise FenceError(f"etcd answered {path} with something that is not JSON: {data[:200]!r}") from error
        if not isinstance(answer, dict) or "header" not in answer:
            raise FenceError(f"etcd answered {path} with {answer!r}")
        return answer

    def close(self) -> None:
        """Nothing to close: every call is a request of its own."""


def _response(answer: Mapping[str, Any], index: int, kind: str) -> Dict[str, Any]:
    """The `index`-th response of a transaction's answer, of `kind` (`response_range`…)."""
    responses: List[Any] = answer.get("responses") or []
    try:
        found = responses[index][kind]
    except (IndexError, KeyError, TypeError):
        raise FenceError(f"etcd's answer has no {kind} at {index}: {answer!r}") from None
    if not isinstance(found, dict):
        raise FenceError(f"etcd's answer has no {kind} at {index}: {answer!r}")
    return found


def _value(kv: Mapping[str, Any]) -> bytes:
    """A key-value's value (an empty one is left out of the JSON)."""
    try:
        return base64.b64decode(kv.get("value", ""), validate=True)
    except (ValueError, TypeError) as error:
        raise FenceError(f"etcd answered a value that is not base64: {kv!r}") from error
