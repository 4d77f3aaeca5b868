"""S3 (boto3, the extra `fence-s3`): any S3 service with conditional writes
(`If-Match` and `If-None-Match: *` on PutObject: AWS S3, MinIO, Cloudflare R2). The
fence of a resource is the object `<prefix><resource>` (default prefix
`leasehold/fence/`) whose body is a 26-byte header and the value::

    b"LHF1" + the token as 20 zero-padded ASCII digits + b"v" or b"-" + b"\\n" + value

`v`: a value follows (possibly empty); `-`: none, the fence was only advanced. The
token is in the body, not only in metadata, so that the object's ETag (the MD5 of
the body) changes with every token. S3 has no "write if smaller", so a write is a
loop of two requests:

1. GET the object. None: the PUT is conditional on `If-None-Match: *`. Else its
   token is compared with ours (once per grant: stored < ours; many: <=); refused:
   `Superseded`, nothing written; admitted: the PUT is conditional on `If-Match: <the
   ETag the GET returned>`.
2. PUT the new body (`advance` keeps the stored flag and value, or writes `-` for a
   new resource). 200: `Accepted`. 412 PreconditionFailed, or 409
   ConditionalRequestConflict (AWS's answer to concurrent conditional writes):
   another writer came between the two requests; go to 1 after a short random pause
   (1-20 ms, growing), at most 100 rounds. Anything else: `FenceError` (the PUT may
   or may not have landed; retry with the same token).

Guaranteed: the store refuses the PUT when the object changed since the GET, in the
same step as the write, and the tokens in an object only grow, so a stale writer's
ETag never matches again: a write with an older token is never stored, and `seen` is
a token the object held (the current one is at least as new). An accepted write is as
durable as the service makes a completed PUT. Not guaranteed: anything that deletes
the objects under the prefix (a caller with DeleteObject, a lifecycle expiration
rule) resets the fence and lets a stale token write again; a writer that keeps
losing races gives up after 100 rounds with a `FenceError`. S3 answers 403, not 404,
for a missing object when the credentials lack `s3:ListBucket`: give them that too.

Cost: 2 requests per write (GET and PUT), 1 when the write is refused, 2 more for
every race lost to another writer; `read` is one GET.

Retries: `from_url` keeps botocore's own retries (its "standard" mode, 3 attempts)
for throttling, 5xx answers and broken connections. A retry never weakens the fence:
a retried GET only reads, and a retried PUT carries the same condition, so when the
first attempt had landed, the retry answers 412 (the ETag changed) and the loop
reads again and finds our own token: once per grant, the write then answers
`Superseded` with `is_ours` (our write landed, as the contract says of a retry);
many per grant, it writes the same value again. (A many-per-grant write of the body
already stored leaves the ETag as it was: its retry succeeds again, harmlessly.)
Turning them off would only turn those transient errors into `FenceError`s for the
caller to retry the same way. A client passed to `S3Fence` keeps its own retries.
"""

from __future__ import annotations

import random
import time
from typing import Any, Dict, Optional, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

from leasehold.fence import (
    _Adapter,
    Accepted,
    FenceError,
    FencingToken,
    Mode,
    Outcome,
    Record,
    Superseded,
    TOKEN_DIGITS,
    TOKEN_MAX,
    _padded,
    validate_resource,
)

#: The prefix of the fences' object keys (docs/fenced-writes.md).
DEFAULT_PREFIX = "leasehold/fence/"
#: The first bytes of every fence object's body.
MAGIC = b"LHF1"
#: The header before the value: MAGIC, TOKEN_DIGITS digits, the flag and a newline.
HEADER_BYTES = len(MAGIC) + TOKEN_DIGITS + 2
#: The flag of a body that holds a value (possibly empty).
HAS_VALUE = b"v"
#: The flag of a body without a value: the fence was only advanced.
NO_VALUE = b"-"
#: Rounds of GET and conditional PUT before a write gives up.
MAX_ROUNDS = 100
#: The pause between rounds: random, from PAUSE_MIN up to a bound that grows by
#: PAUSE_MIN each round, at most PAUSE_MAX (seconds).
PAUSE_MIN, PAUSE_MAX = 0.001, 0.020
#: The region when the URL names none.
DEFAULT_REGION = "us-east-1"


def _driver() -> Tuple[Any, Any]:
    """boto3 and botocore."""
    try:
        import boto3  # type: ignore[import-untyped,unused-ignore]
        import botocore  # type: ignore[import-untyped,unused-ignore]
        import botocore.config  # type: ignore[import-untyped,unused-ignore]
        import botocore.exceptions  # type: ignore[import-untyped,unused-ignore]
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise FenceError("S3Fence needs boto3: pip install 'leasehold[fence-s3]'") from error
    return boto3, botocore


def client_arguments(url: str) -> Dict[str, Any]:
    """The bucket and the `boto3` client arguments (without `config`) of
    `http[s]://ACCESS_KEY:SECRET@HOST:PORT/BUCKET[?region=R]` (key and secret
    percent-encoded; region `us-east-1` by default)."""
    form = "http[s]://ACCESS_KEY:SECRET@HOST:PORT/BUCKET[?region=R]"
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise FenceError(f"{url!r} is not an S3 URL ({form})")
    if not parts.username or parts.password is None:
        raise FenceError(f"{url!r} carries no access key and secret ({form})")
    try:
        parts.port
    except ValueError:
        raise FenceError(f"{url!r} has a bad port ({form})") from None
    bucket = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not bucket or "/" in bucket:
        raise FenceError(f"{url!r} names no bucket ({form})")
    region = DEFAULT_REGION
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name != "region" or not value:
            raise FenceError(f"{url!r}: unknown or empty parameter {name!r} (only region=R)")
        region = value
    return {
        "bucket": bucket,
        "endpoint_url": f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}",
        "region_name": region,
        "aws_access_key_id": unquote(parts.username),
        "aws_secret_access_key": unquote(parts.password),
    }


def encode(token: FencingToken, value: Optional[bytes]) -> bytes:
    """The body of a fence object: the header with `token`, then `value` (None: the
    `-` flag and no value)."""
    flag = NO_VALUE if value is None else HAS_VALUE
    return MAGIC + _padded(token).encode("ascii") + flag + b"\n" + (value or b"")


def decode(body: bytes, where: str) -> Record:
    """The token and value of a fence object's body; FenceError when `body` is not one."""
    digits, flag = body[len(MAGIC) : HEADER_BYTES - 2], body[HEADER_BYTES - 2 : HEADER_BYTES - 1]
    if (
        len(body) < HEADER_BYTES
        or body[: len(MAGIC)] != MAGIC
        or body[HEADER_BYTES - 1 : HEADER_BYTES] != b"\n"
        or flag not in (HAS_VALUE, NO_VALUE)
        or not (digits.isascii() and digits.isdigit())
        or int(digits) > TOKEN_MAX
        or (flag == NO_VALUE and len(body) > HEADER_BYTES)
    ):
        raise FenceError(f"{where} is not a Leasehold fence object (it starts {body[:HEADER_BYTES]!r})")
    return Record(FencingToken(int(digits)), body[HEADER_BYTES:] if flag == HAS_VALUE else None)


def _admits(mode: Mode, stored: FencingToken, ours: FencingToken) -> bool:
    return stored < ours if mode is Mode.ONCE_PER_GRANT else stored <= ours


class S3Fence(_Adapter):
    """Fenced writes to the objects of an S3 bucket.

    `client` is a boto3 S3 client (`boto3.client("s3", ...)`; path-style addressing
    for a service other than AWS) and `bucket` the bucket's name; `from_url` makes
    both from a URL. `prefix` goes before the resource in the object key. boto3's
    clients are thread-safe, and so is the adapter. Store failures (unreachable, an
    answer other than the conditional write's, an object that is not a fence) raise
    `FenceError` (botocore's error is its `__cause__`).
    """

    def __init__(self, client: Any, bucket: str, prefix: str = DEFAULT_PREFIX) -> None:
        _driver()
        if not all(callable(getattr(client, method, None)) for method in ("get_object", "put_object")):
            raise FenceError(f"S3Fence needs a boto3 S3 client, not {client!r}")
        if not isinstance(bucket, str) or not bucket:
            raise FenceError(f"{bucket!r} is not a bucket name")
        if not isinstance(prefix, str):
            raise FenceError("a key prefix is a str")
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._owned = False

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX) -> "S3Fence":
        """An adapter with a client of its own (closed by `close`) for
        `http[s]://ACCESS_KEY:SECRET@HOST:PORT/BUCKET[?region=R]`: path-style
        addressing, SigV4, botocore's standard retries (3 attempts)."""
        boto3, botocore = _driver()
        arguments = client_arguments(url)
        bucket = arguments.pop("bucket")
        config = botocore.config.Config(
            s3={"addressing_style": "path"},
            signature_version="s3v4",
            retries={"mode": "standard", "total_max_attempts": 3},
            connect_timeout=10,
            read_timeout=30,
        )
        try:
            client = boto3.session.Session().client("s3", config=config, **arguments)
        except (botocore.exceptions.BotoCoreError, ValueError) as error:
            raise FenceError(f"could not make an S3 client for {url!r}: {error}") from error
        fence = cls(client, bucket, prefix)
        fence._owned = True
        return fence

    def key(self, resource: str) -> str:
        """The key of the object that holds the resource's fence."""
        return self._prefix + validate_resource(resource)

    def _where(self, key: str) -> str:
        return f"s3://{self._bucket}/{key}"

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        _, botocore = _driver()
        key = self.key(resource)
        for round_ in range(MAX_ROUNDS):
            if round_:
                time.sleep(random.uniform(PAUSE_MIN, min(PAUSE_MAX, PAUSE_MIN * (round_ + 1))))
            found = self._get(key)
            if found is None:
                condition = {"IfNoneMatch": "*"}
                body = encode(token, value)
            else:
                stored, etag = found
                if not _admits(mode, stored.token, token):
                    return Superseded(seen=stored.token, ours=token)
                condition = {"IfMatch": etag}
                body = encode(token, stored.value if value is None else value)
            try:
                self._client.put_object(Bucket=self._bucket, Key=key, Body=body, **condition)
            except botocore.exceptions.ClientError as error:
                status, code = _status_and_code(error)
                if status == 412 or (status == 409 and code == "ConditionalRequestConflict"):
                    continue  # another writer came between the GET and the PUT
                raise FenceError(f"fenced write to {self._where(key)} failed: {error}") from error
            except botocore.exceptions.BotoCoreError as error:
                raise FenceError(f"fenced write to {self._where(key)} failed: {error}") from error
            return Accepted()
        raise FenceError(
            f"fenced write to {self._where(key)} lost {MAX_ROUNDS} races with other writers; retry with the same token"
        )

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value (one GET), or None."""
        found = self._get(self.key(resource))
        return None if found is None else found[0]

    def _get(self, key: str) -> Optional[Tuple[Record, str]]:
        """The object's record and ETag, or None when there is no object."""
        _, botocore = _driver()
        try:
            answer = self._client.get_object(Bucket=self._bucket, Key=key)
            stream = answer["Body"]
            try:
                body = stream.read()
            finally:
                stream.close()
        except botocore.exceptions.ClientError as error:
            status, code = _status_and_code(error)
            if code == "NoSuchKey":
                return None
            hint = " (S3 answers 403 for a missing object without s3:ListBucket)" if status == 403 else ""
            raise FenceError(f"fence read of {self._where(key)} failed: {error}{hint}") from error
        except botocore.exceptions.BotoCoreError as error:
            raise FenceError(f"fence read of {self._where(key)} failed: {error}") from error
        etag = answer.get("ETag")
        if not isinstance(etag, str) or not etag:
            raise FenceError(f"S3 answered the GET of {self._where(key)} without an ETag")
        return decode(body, self._where(key)), etag

    def close(self) -> None:
        """Closes the client if the adapter made it (`from_url`), not one it was given."""
        if self._owned:
            self._client.close()


def _status_and_code(error: Any) -> Tuple[Optional[int], str]:
    """The HTTP status and S3 error code of a botocore `ClientError`."""
    response = getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status, str(response.get("Error", {}).get("Code", ""))
