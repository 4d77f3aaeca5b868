"""Where a program finds its cluster and its credentials: the `LEASEHOLD_*`
environment variables, the same the `leasehold` CLI and the Rust library read.

| variable | what |
|---|---|
| `LEASEHOLD_ENDPOINTS` | the nodes' client addresses, comma-separated |
| `LEASEHOLD_CA_FILE` | the CA (PEM) that signed the nodes' client-port certificates |
| `LEASEHOLD_TOKEN_FILE` | a file whose first line is the bearer token (a tenant's) |
| `LEASEHOLD_TOKEN` | the bearer token itself (prefer the file: the environment leaks) |
| `LEASEHOLD_CERT_FILE`, `LEASEHOLD_KEY_FILE` | a client certificate and its key, instead of a token |
| `LEASEHOLD_INSECURE_PLAINTEXT` | `1`: no TLS, for a cluster started with --insecure-plaintext |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Mapping, Optional

from leasehold.client import DEFAULT_ENDPOINTS, Client, parse_endpoints
from leasehold.errors import InvalidArgument

ENV_ENDPOINTS = "LEASEHOLD_ENDPOINTS"
ENV_CA_FILE = "LEASEHOLD_CA_FILE"
ENV_TOKEN_FILE = "LEASEHOLD_TOKEN_FILE"
ENV_TOKEN = "LEASEHOLD_TOKEN"
ENV_CERT_FILE = "LEASEHOLD_CERT_FILE"
ENV_KEY_FILE = "LEASEHOLD_KEY_FILE"
ENV_INSECURE_PLAINTEXT = "LEASEHOLD_INSECURE_PLAINTEXT"
#: The admin credential's file, for admin tools.
ENV_ADMIN_TOKEN_FILE = "LEASEHOLD_ADMIN_TOKEN_FILE"


def read_token_file(path: Path) -> str:
    """The first line of a secret file, trimmed."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise InvalidArgument(f"cannot read the token file {path}: {error}") from None
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise InvalidArgument(f"the token file {path} is empty")
    return token


def _read_file(what: str, path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise InvalidArgument(f"cannot read the {what} {path}: {error}") from None


@dataclass
class Settings:
    """How to reach a cluster and prove who we are."""

    endpoints: List[str] = field(default_factory=lambda: parse_endpoints(DEFAULT_ENDPOINTS))
    ca_file: Optional[Path] = None
    token_file: Optional[Path] = None
    token: Optional[str] = None
    cert_file: Optional[Path] = None
    key_file: Optional[Path] = None
    insecure_plaintext: bool = False

    @classmethod
    def from_env(cls, environment: Optional[Mapping[str, str]] = None) -> "Settings":
        """The settings in `environment` (this process's by default; see the module)."""
        env = os.environ if environment is None else environment

        def path(name: str) -> Optional[Path]:
            value = env.get(name, "")
            return Path(value) if value else None

        return cls(
            endpoints=parse_endpoints(env.get(ENV_ENDPOINTS) or DEFAULT_ENDPOINTS),
            ca_file=path(ENV_CA_FILE),
            token_file=path(ENV_TOKEN_FILE),
            token=env.get(ENV_TOKEN) or None,
            cert_file=path(ENV_CERT_FILE),
            key_file=path(ENV_KEY_FILE),
            insecure_plaintext=env.get(ENV_INSECURE_PLAINTEXT) == "1",
        )

    def client(self, **options: object) -> Client:
        """A client configured by these settings (it connects on first use); `options`
        go to `Client` (client_name, request_deadline). Refuses settings that
        contradict themselves, naming the variables."""
        if self.ca_file is not None and self.insecure_plaintext:
            raise InvalidArgument(
                f"{ENV_CA_FILE} and {ENV_INSECURE_PLAINTEXT} contradict each other: choose TLS or plaintext"
            )
        if self.ca_file is None and not self.insecure_plaintext:
            raise InvalidArgument(
                f"no CA to verify the cluster with: set {ENV_CA_FILE} to the CA that signed the nodes' "
                f"certificates, or {ENV_INSECURE_PLAINTEXT}=1 for a cluster started with --insecure-plaintext"
            )
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgument(f"{ENV_CERT_FILE} and {ENV_KEY_FILE} go together: give both or neither")
        if self.cert_file is not None and self.insecure_plaintext:
            raise InvalidArgument("a client certificate needs TLS")
        if self.token is not None and self.token_file is not None:
            raise InvalidArgument(f"give {ENV_TOKEN} or {ENV_TOKEN_FILE}, not both")
        token = self.token if self.token is not None else None
        if self.token_file is not None:
            token = read_token_file(self.token_file)
        client_certificate = None
        if self.cert_file is not None and self.key_file is not None:
            client_certificate = (_read_file("certificate", self.cert_file), _read_file("key", self.key_file))
        return Client(
            self.endpoints,
            ca_certificate=_read_file("CA file", self.ca_file) if self.ca_file is not None else None,
            token=token,
            client_certificate=client_certificate,
            insecure_plaintext=self.insecure_plaintext,
            **options,  # type: ignore[arg-type]
        )
