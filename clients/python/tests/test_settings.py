"""The LEASEHOLD_* variables, and settings that contradict themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from leasehold import Client, InvalidArgument, Settings


def test_reads_the_variables_the_cli_reads(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "LEASEHOLD_ENDPOINTS": "127.0.0.1:1, 127.0.0.1:2,",
            "LEASEHOLD_CA_FILE": str(tmp_path / "ca.pem"),
            "LEASEHOLD_TOKEN_FILE": str(tmp_path / "t.token"),
        }
    )
    assert settings.endpoints == ["127.0.0.1:1", "127.0.0.1:2"]
    assert settings.ca_file == tmp_path / "ca.pem" and settings.token_file == tmp_path / "t.token"
    assert Settings.from_env({}).endpoints == ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]


def test_refuses_settings_that_contradict_themselves(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until a connection is made")
    token = tmp_path / "t.token"
    token.write_text("tok_abc\nsecond line ignored\n")
    cases = [
        (Settings(ca_file=ca, insecure_plaintext=True), "contradict"),
        (Settings(), "no CA"),
        (Settings(ca_file=ca, cert_file=ca), "go together"),
        (Settings(ca_file=ca, token="a", token_file=token), "not both"),
        (Settings(ca_file=ca, token_file=tmp_path / "missing"), "cannot read the token file"),
    ]
    for settings, words in cases:
        with pytest.raises(InvalidArgument, match=words):
            settings.client()
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(InvalidArgument, match="is empty"):
        Settings(ca_file=ca, token_file=empty).client()
    client = Settings(ca_file=ca, token_file=token).client()
    assert client.metadata == (("authorization", "Bearer tok_abc"),)
    client.close()


def test_a_client_needs_endpoints_and_a_choice_of_tls_or_plaintext() -> None:
    with pytest.raises(InvalidArgument, match="no endpoints"):
        Client(" , ", insecure_plaintext=True)
    with pytest.raises(InvalidArgument, match="no CA"):
        Client("127.0.0.1:1")
    with pytest.raises(InvalidArgument, match="printable ASCII"):
        Client("127.0.0.1:1", insecure_plaintext=True, token="tok\n")
    client = Client(["http://127.0.0.1:1", "127.0.0.1:2"], insecure_plaintext=True)
    assert client.endpoints == ("127.0.0.1:1", "127.0.0.1:2") and client.client_id != 0
    client.close()
