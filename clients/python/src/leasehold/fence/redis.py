"""Redis (redis-py, the extra `fence-redis`): the fence is the hash
`leasehold:fence:<resource>` with the fields `token` (20 decimal digits, zero-padded)
and `value`, checked and written by one Lua script (`EVALSHA`), which runs atomically
on the server. The script compares the padded tokens byte by byte (Lua's numbers are
doubles, exact only up to 2**53).

Guaranteed: atomic per write on one Redis. Durable across a restart only as far as
the server is configured (`appendonly yes`, `appendfsync always`), and not across a
failover to an asynchronous replica. redis-py may resend a command whose answer was
lost (its `retry`): in once-per-grant mode such a write can answer `Superseded` with
`is_ours`, which means it landed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Union

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

if TYPE_CHECKING:
    import redis

#: The prefix of the fences' keys (docs/fenced-writes.md).
DEFAULT_PREFIX = "leasehold:fence:"

#: KEYS[1]: the resource's hash. ARGV[1]: our token, 20 digits; ARGV[2]: "once" or
#: "many"; ARGV[3]: the value, when there is one (advance sends none).
#: Answers {1} when it wrote, {0, stored token} when it refused.
FENCE_SCRIPT = """
local stored = redis.call('HGET', KEYS[1], 'token')
if stored then
  if #stored ~= 20 or not string.match(stored, '^%d+$') then
    return redis.error_reply('leasehold fence: the token field of ' .. KEYS[1] .. ' is not 20 digits')
  end
  local order = 0
  for i = 1, 20 do
    local a, b = string.byte(stored, i), string.byte(ARGV[1], i)
    if a ~= b then
      if a < b then order = -1 else order = 1 end
      break
    end
  end
  if order > 0 or (order == 0 and ARGV[2] ~= 'many') then
    return {0, stored}
  end
end
if #ARGV >= 3 then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
end
return {1}
"""


def _driver() -> Any:
    try:
        import redis
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise FenceError("RedisFence needs redis-py: pip install 'leasehold[fence-redis]'") from error
    return redis


class RedisFence(_Adapter):
    """Fenced writes to Redis hashes.

    `client` is a `redis.Redis` that does not decode responses (values are bytes), or
    a URL (`redis://host:port/db`) from which the adapter makes one of its own (closed
    by `close`). redis-py's client is thread-safe and reconnects by itself. `prefix`
    goes before the resource in the key. Store failures raise `FenceError`.
    """

    def __init__(self, client: Union["redis.Redis", str], prefix: str = DEFAULT_PREFIX) -> None:
        driver = _driver()
        self._owned = isinstance(client, str)
        if isinstance(client, str):
            try:
                client = driver.Redis.from_url(client)
            except (ValueError, driver.exceptions.RedisError) as error:
                raise FenceError(f"{client!r} is not a Redis URL: {error}") from error
        if not isinstance(client, driver.Redis):
            raise FenceError(f"RedisFence needs a redis.Redis or a URL, not {client!r}")
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise FenceError("RedisFence needs a client with decode_responses=False: values are bytes")
        if not isinstance(prefix, str):
            raise FenceError("a key prefix is a str")
        self._client = client
        self._prefix = prefix
        self._script = client.register_script(FENCE_SCRIPT)

    def key(self, resource: str) -> str:
        """The hash that holds the resource's fence."""
        return self._prefix + validate_resource(resource)

    def _fence(self, resource: str, token: FencingToken, mode: Mode, value: Optional[bytes]) -> Outcome:
        return self._run(resource, token, mode, [] if value is None else [value])

    def _run(self, resource: str, token: FencingToken, mode: Mode, value: List[bytes]) -> Outcome:
        driver = _driver()
        try:
            answer = self._script(keys=[self.key(resource)], args=[_padded(token), mode.value, *value])
        except driver.exceptions.RedisError as error:
            raise FenceError(f"fenced write to Redis failed: {error}") from error
        if answer == [1]:
            return Accepted()
        if isinstance(answer, list) and len(answer) == 2 and answer[0] == 0:
            return Superseded(seen=_unpadded(answer[1], f"Redis key {self.key(resource)!r}"), ours=token)
        raise FenceError(f"the fence script answered {answer!r}")

    def read(self, resource: str) -> Optional[Record]:
        """The stored token and value, or None."""
        driver = _driver()
        key = self.key(resource)
        try:
            token, value = self._client.hmget(key, ["token", "value"])
        except driver.exceptions.RedisError as error:
            raise FenceError(f"fence read from Redis failed: {error}") from error
        if token is None:
            return None
        return Record(_unpadded(token, f"Redis key {key!r}"), value)

    def close(self) -> None:
        """Closes the client if the adapter made it (not one it was given)."""
        if self._owned:
            self._client.close()
