"""Fixtures: a real three-node cluster for the whole run (started from the project's
binaries, see `cluster.py`), clients of it, and the tests' private PostgreSQL
(`scripts/postgres.sh`, on 127.0.0.1:15432)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import leasehold  # noqa: E402

from cluster import REPOSITORY, LocalCluster  # noqa: E402

POSTGRES_SCRIPT = REPOSITORY / "scripts" / "postgres.sh"
STORES_SCRIPT = REPOSITORY / "scripts" / "stores.sh"


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three nodes on free loopback ports with TLS, an admin token and the tenant
    `test`, stopped (by process id) when the run ends. Tests that kill or pause a node
    bring it back before they end."""
    root = Path(tempfile.mkdtemp(prefix="leasehold-python-cluster-"))
    local = LocalCluster(root)
    try:
        local.start()
        yield local
    finally:
        local.stop()
        if request.session.testsfailed:
            for node_id in local.nodes:
                print(f"\n---- node {node_id} log (last lines; all in {root}) ----\n{local.log_tail(node_id)}")
        else:
            subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[leasehold.Client]:
    """A client of every node as the tenant `test`; closed (with its sessions) after."""
    with cluster.client() as made:
        yield made


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Names of this test's own: the cluster is shared by the whole run."""
    prefix = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:80]
    return lambda name: f"{prefix}/{name}"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The tests' PostgreSQL: started with scripts/postgres.sh unless it runs, and then
    stopped again at the end of the run."""
    started = False
    if "LEASEHOLD_TEST_DATABASE_URL" in os.environ:
        yield os.environ["LEASEHOLD_TEST_DATABASE_URL"]
        return
    if subprocess.run([str(POSTGRES_SCRIPT), "status"], capture_output=True).returncode != 0:
        made = subprocess.run([str(POSTGRES_SCRIPT), "start"], capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, f"scripts/postgres.sh start failed:\n{made.stdout}{made.stderr}"
        started = True
    url = subprocess.run([str(POSTGRES_SCRIPT), "url"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield url
    finally:
        if started:
            subprocess.run([str(POSTGRES_SCRIPT), "stop"], capture_output=True, timeout=60)


def _shared_store(name: str) -> Iterator[str]:
    """Instance 0 of a test store (scripts/stores.sh), shared with concurrent runs: started
    unless it runs, and then stopped again at the end of the run."""
    started = False
    if subprocess.run([str(STORES_SCRIPT), "status", name], capture_output=True).returncode != 0:
        made = subprocess.run([str(STORES_SCRIPT), "start", name], capture_output=True, text=True, timeout=180)
        assert made.returncode == 0, f"scripts/stores.sh start {name} failed:\n{made.stdout}{made.stderr}"
        started = True
    url = subprocess.run([str(STORES_SCRIPT), "url", name], capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield url
    finally:
        if started:
            subprocess.run([str(STORES_SCRIPT), "stop", name], capture_output=True, timeout=90)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The tests' Redis (scripts/stores.sh, instance 0: redis://127.0.0.1:16379/)."""
    yield from _shared_store("redis")


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """The tests' MariaDB (scripts/stores.sh, instance 0: mysql://root@127.0.0.1:13306/leasehold)."""
    yield from _shared_store("mariadb")


@pytest.fixture(scope="session")
def etcd_url() -> Iterator[str]:
    """The tests' etcd (scripts/stores.sh, instance 0: http://127.0.0.1:12379)."""
    yield from _shared_store("etcd")


@pytest.fixture(scope="session")
def s3_url() -> Iterator[str]:
    """The tests' S3, moto's server (scripts/stores.sh, instance 0:
    http://KEY:SECRET@127.0.0.1:19000/leasehold?region=us-east-1, bucket `leasehold`)."""
    yield from _shared_store("s3")
