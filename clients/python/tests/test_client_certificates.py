"""A tenant may authenticate with a client certificate instead of a token: one the
cluster CA signed for `<tenant>.<tag>.tenant.leasehold` (`leasehold cert tenant
--token-file`), the tag bound to the tenant's token. The certificate's tenant is the
namespace its locks live in; a certificate of a tenant that does not exist is
refused."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable, Tuple

import pytest

import leasehold
from cluster import TEST_TENANT, LocalCluster

pytestmark = pytest.mark.cluster


def tenant_certificate(cluster: LocalCluster, tenant: str, token_file: Path) -> Tuple[Path, Path]:
    made = subprocess.run(
        [str(cluster.cli), "cert", "tenant", str(cluster.certs), tenant, "--token-file", str(token_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, f"leasehold cert tenant: {made.stderr}"
    return cluster.certs / f"tenant-{tenant}.pem", cluster.certs / f"tenant-{tenant}.key"


def by_certificate(cluster: LocalCluster, tenant: str, token_file: Path) -> leasehold.Client:
    cert_file, key_file = tenant_certificate(cluster, tenant, token_file)
    settings = leasehold.Settings(
        endpoints=cluster.endpoints, ca_file=cluster.ca_file, cert_file=cert_file, key_file=key_file
    )
    return settings.client(client_name=f"certificate-of-{tenant}")


def test_a_tenant_certificate_takes_locks_in_its_tenant(cluster: LocalCluster, unique: Callable[[str], str]) -> None:
    name = unique("by-certificate")
    with by_certificate(cluster, TEST_TENANT, cluster.token_file) as client, client.session(ttl=10) as session:
        with session.lock(name, wait=10) as guard:
            assert guard.token > 0
            with cluster.client() as by_token:
                described = by_token.describe_lock(name)
                assert described.holder.session_id == session.id, "the token's tenant sees the same lock"
                assert by_token.session(ttl=10).try_lock(name) is None, "and cannot take it while it is held"


def test_a_certificate_of_no_tenant_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    made_up = tmp_path / "made-up.token"
    made_up.write_text("tenant_0123456789abcdef0123456789abcdef\n")
    with by_certificate(cluster, "nobody-here", made_up) as client:
        with pytest.raises(leasehold.Unauthenticated) as refused:
            client.session(ttl=10)
    assert "nobody-here" in str(refused.value)
