"""FencingToken: SQL BIGINT and header conversions that refuse rather than wrap."""

from __future__ import annotations

import pytest

from leasehold import FencingToken, FencingTokenError


def test_converts_to_and_from_an_sql_bigint_without_wrapping() -> None:
    assert FencingToken(42).to_sql_bigint() == 42
    assert FencingToken(2**63 - 1).to_sql_bigint() == 2**63 - 1
    with pytest.raises(FencingTokenError):
        FencingToken(2**63).to_sql_bigint()
    assert FencingToken.from_sql_bigint(7) == FencingToken(7)
    with pytest.raises(FencingTokenError):
        FencingToken.from_sql_bigint(-1)


def test_round_trips_through_a_header_value() -> None:
    token = FencingToken(123_456)
    assert token.header_value() == "123456" and FencingToken.HEADER_NAME == "Leasehold-Fencing-Token"
    assert FencingToken.from_header_value(" 123456 ") == token
    for bad in ["", "-1", "+1", "1 2", "0x10", "18446744073709551616", "١٢"]:
        with pytest.raises(FencingTokenError):
            FencingToken.from_header_value(bad)


def test_orders_like_the_grants_it_comes_from() -> None:
    assert FencingToken(9) < FencingToken(10)
    assert int(FencingToken(5)) == 5 and str(FencingToken(5)) == "5"
    for not_a_token in [-1, 2**64, True, 1.5]:
        with pytest.raises(FencingTokenError):
            FencingToken(not_a_token)  # type: ignore[arg-type]
