"""A real Leasehold cluster on 127.0.0.1 for the tests: `leasehold-server` processes
started the way `cluster.sh` and `jepsen-like-tests/src/cluster.rs` start them (TLS on
both ports, an admin token, a tenant made with the `leasehold` CLI), on free ports.

Credentials come from the project's own CLI: `leasehold cert ca`, `leasehold cert
node`, `leasehold new-token`, and `leasehold tenant add` for the tests' tenant. Every
node is a process of its own in its own process group; it is signalled (SIGKILL,
SIGSTOP, SIGCONT) by the process id this module recorded, never by name.
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Dict, List, Optional

import leasehold

from waiting import until

#: The repository's root (clients/python/tests → the checkout).
REPOSITORY = Path(__file__).resolve().parents[3]
#: The tenant the tests act as.
TEST_TENANT = "test"
#: Lines of each node's log shown when a test fails.
LOG_TAIL_LINES = 40
#: How long a node may take to listen on its addresses, and the cluster to elect.
START_WAIT_S = 30.0
#: Where test servers' ports are picked from when the ephemeral range is unknown.
TEST_PORTS_FALLBACK = (20_000, 32_768)

# Port reservations of this process (open, locked files), held until it exits.
_reserved: List[IO[bytes]] = []


def binary_directory() -> Path:
    """Where `leasehold-server` and `leasehold` are: `LEASEHOLD_BIN_DIR`, else the
    release directory of the target directory `scripts/env.sh` uses."""
    if os.environ.get("LEASEHOLD_BIN_DIR"):
        return Path(os.environ["LEASEHOLD_BIN_DIR"])
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "release"
    shared = Path("/var/cache/leasehold/target/release")
    if (shared / "leasehold-server").exists():
        return shared
    return REPOSITORY / "target" / "release"


def _test_port_range() -> range:
    """Below the kernel's ephemeral range, so that no outgoing connection is given a
    port between the moment it is picked and the moment a server binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(*TEST_PORTS_FALLBACK)
    if low >= 12_000:
        return range(max(low - 12_000, 10_000), low)
    return range(*TEST_PORTS_FALLBACK)


def _reserve(port: int) -> bool:
    """Reserves `port` against every test process that picks ports this way (this
    suite and the Rust cluster tests): an exclusive flock on a file named after it,
    held until this process exits."""
    directory = Path(tempfile.gettempdir()) / "leasehold-test-ports"
    directory.mkdir(exist_ok=True)
    handle = open(directory / str(port), "ab")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _reserved.append(handle)
    return True


def free_ports(count: int) -> List[int]:
    """`count` distinct free loopback ports, reserved and checked by binding once."""
    ports: List[int] = []
    candidates = _test_port_range()
    for _ in range(10_000):
        if len(ports) == count:
            return ports
        port = random.choice(candidates)
        if port in ports or not _reserve(port):
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    raise AssertionError(f"no {count} free ports in {candidates} on 127.0.0.1")


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.2):
            return True
    except OSError:
        return False


class Node:
    """One `leasehold-server` process and where it listens."""

    def __init__(self, node_id: int, client_addr: str, peer_addr: str, status_addr: str, root: Path) -> None:
        self.id = node_id
        self.client_addr = client_addr
        self.peer_addr = peer_addr
        #: The status page (HTTPS with the node's certificate).
        self.status_addr = status_addr
        self.data_dir = root / f"node{node_id}"
        self.log = root / f"node{node_id}.log"
        self.process: Optional[subprocess.Popen] = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"node {self.id} is not running"
        return self.process.pid


class LocalCluster:
    """Three (or `size`) nodes on loopback with TLS, an admin token and a tenant."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        self.bin = binary_directory()
        self.server = self.bin / "leasehold-server"
        self.cli = self.bin / "leasehold"
        for program in (self.server, self.cli):
            if not program.exists():
                raise AssertionError(
                    f"{program} is missing: build the workspace (scripts/test.sh or cluster.sh do) "
                    "or point LEASEHOLD_BIN_DIR at the binaries"
                )
        self.certs = root / "certs"
        self.ca_file = self.certs / "ca.pem"
        self.admin_token_file = root / "admin.token"
        self.token_file = root / f"{TEST_TENANT}.token"
        # Unique, so that a node reaching another test's cluster is refused.
        self.cluster_name = f"python-{random.getrandbits(32):08x}"
        self.nodes: Dict[int, Node] = {}
        ports = free_ports(3 * size)
        for node_id in range(1, size + 1):
            client_port, peer_port, status_port = ports[3 * node_id - 3 : 3 * node_id]
            addresses = [f"127.0.0.1:{port}" for port in (client_port, peer_port, status_port)]
            self.nodes[node_id] = Node(node_id, *addresses, root)

    # ------------------------------------------------------------------ starting

    def _cli(self, *arguments: str, admin: bool = False) -> subprocess.CompletedProcess:
        """The `leasehold` CLI against this cluster, with none of the caller's
        LEASEHOLD_* variables mixed in."""
        environment = {key: value for key, value in os.environ.items() if not key.startswith("LEASEHOLD_")}
        command = [str(self.cli), "--endpoints", ",".join(self.endpoints), "--ca-file", str(self.ca_file)]
        if admin:
            command += ["--admin-token-file", str(self.admin_token_file)]
        return subprocess.run(
            command + list(arguments), env=environment, capture_output=True, text=True, timeout=60, check=False
        )

    def _make_credentials(self) -> None:
        self.certs.mkdir(parents=True)
        for arguments in [["cert", "ca", str(self.certs)]] + [
            ["cert", "node", str(self.certs), "--id", str(node_id), "--host", "127.0.0.1", "--host", "localhost"]
            for node_id in self.nodes
        ]:
            made = subprocess.run([str(self.cli), *arguments], capture_output=True, text=True, timeout=60)
            assert made.returncode == 0, f"leasehold {' '.join(arguments)}: {made.stderr}"
        token = subprocess.run(
            [str(self.cli), "new-token", "--prefix", "admin"], capture_output=True, text=True, timeout=60
        )
        assert token.returncode == 0, token.stderr
        self.admin_token_file.write_text(token.stdout)
        self.admin_token_file.chmod(0o600)

    def arguments(self, node: Node) -> List[str]:
        """The flags node `node` is started with (as cluster.rs gives them)."""
        cert, key = self.certs / f"node-{node.id}.pem", self.certs / f"node-{node.id}.key"
        arguments = [
            "--node-id", str(node.id),
            "--cluster-name", self.cluster_name,
            "--data-dir", str(node.data_dir),
            "--client-addr", node.client_addr,
            "--peer-addr", node.peer_addr,
            "--status-addr", node.status_addr,
            "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(self.ca_file),
            "--peer-cert", str(cert), "--peer-key", str(key), "--peer-ca", str(self.ca_file),
            "--admin-token-file", str(self.admin_token_file),
            # The test tenant's grants of cron/… are counted and shown on the status page
            # (its test).
            "--watch", f"{TEST_TENANT}:cron/*",
        ]  # fmt: skip
        for member in self.nodes.values():
            arguments += ["--initial-member", f"{member.id}={member.client_addr},{member.peer_addr}"]
        # The nodes share this machine's cores (cluster.sh does the same).
        threads = max((os.cpu_count() or 1) // len(self.nodes), 1)
        return arguments + ["--worker-threads", str(threads)]

    def _spawn(self, node: Node) -> None:
        assert not node.running, f"node {node.id} is already running"
        environment = dict(os.environ, RUST_LOG=os.environ.get("LEASEHOLD_TEST_LOG", "info,openraft=warn"))
        with open(node.log, "ab") as log:
            node.process = subprocess.Popen(
                [str(self.server), *self.arguments(node)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )

    def _wait_listening(self, node: Node) -> None:
        def listens() -> bool:
            if not node.running:
                raise AssertionError(f"node {node.id} exited while starting:\n{self.log_tail(node.id)}")
            return all(_listening(address) for address in (node.client_addr, node.peer_addr, node.status_addr))

        addresses = f"{node.client_addr}, {node.peer_addr} and {node.status_addr}"
        until(START_WAIT_S, f"node {node.id} to listen on {addresses}", listens)

    def start(self) -> None:
        """Makes the credentials, starts every node, waits for a leader, adds the tests'
        tenant and waits until every node applied it."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._make_credentials()
        for node in self.nodes.values():
            self._spawn(node)
        for node in self.nodes.values():
            self._wait_listening(node)
        leader = self.wait_for_leader()
        self._add_tenant()
        commit_index = self.status(leader).commit_index
        for node in self.nodes.values():
            self.wait_applied(node.id, commit_index)

    def _add_tenant(self) -> None:
        def added() -> bool:
            made = self._cli(
                "tenant", "add", TEST_TENANT, "--token-file", str(self.token_file),
                "--max-sessions", "1000000", "--max-holds", "10000000", "--max-waiters", "10000000",
                admin=True,
            )  # fmt: skip
            if made.returncode == 76:  # An earlier attempt made it and its answer was lost.
                made = self._cli(
                    "tenant", "rotate-token", TEST_TENANT, "--token-file", str(self.token_file), admin=True
                )
            return made.returncode == 0 and self.token_file.exists()

        until(START_WAIT_S, f"the tenant {TEST_TENANT!r} to be added with `leasehold tenant add`", added)

    # ------------------------------------------------------------------ clients

    @property
    def endpoints(self) -> List[str]:
        return [node.client_addr for node in self.nodes.values()]

    def client(self, endpoints: Optional[List[str]] = None, **options: object) -> leasehold.Client:
        """A client as the tests' tenant (of every node unless `endpoints` is given)."""
        settings = leasehold.Settings(
            endpoints=endpoints or self.endpoints, ca_file=self.ca_file, token_file=self.token_file
        )
        return settings.client(**options)

    def admin_client(self, endpoints: Optional[List[str]] = None) -> leasehold.Client:
        settings = leasehold.Settings(
            endpoints=endpoints or self.endpoints, ca_file=self.ca_file, token_file=self.admin_token_file
        )
        return settings.client()

    def client_env(self) -> Dict[str, str]:
        """What a client process of this cluster needs: the LEASEHOLD_* variables."""
        environment = {key: value for key, value in os.environ.items() if not key.startswith("LEASEHOLD_")}
        environment.update(
            LEASEHOLD_ENDPOINTS=",".join(self.endpoints),
            LEASEHOLD_CA_FILE=str(self.ca_file),
            LEASEHOLD_TOKEN_FILE=str(self.token_file),
        )
        return environment

    def status(self, node_id: int) -> leasehold.proto.messages.StatusResponse:
        node = self.nodes[node_id]
        with self.admin_client([node.client_addr]) as admin:
            return admin.status(node.client_addr)

    def leader(self) -> Optional[int]:
        """The running node that says it leads in the highest term, if any."""
        best: Optional[tuple] = None
        for node in self.nodes.values():
            if not node.running:
                continue
            try:
                status = self.status(node.id)
            except leasehold.Unavailable:
                continue
            if status.state == "leader" and (best is None or status.term > best[0]):
                best = (status.term, node.id)
        return best[1] if best is not None else None

    def wait_for_leader(self, deadline_s: float = START_WAIT_S) -> int:
        return until(deadline_s, "a leader to be elected", self.leader)

    def agreed_leader(self) -> Optional[int]:
        """The leader every running node names, if they all name the same one and it
        says it leads."""
        named = set()
        for node in self.nodes.values():
            if not node.running:
                continue
            try:
                status = self.status(node.id)
            except leasehold.Unavailable:
                return None
            named.add(status.leader_id)
        if len(named) != 1:
            return None
        leader = named.pop()
        if leader == 0 or leader not in self.nodes:
            return None
        try:
            return leader if self.status(leader).state == "leader" else None
        except leasehold.Unavailable:
            return None

    def wait_for_agreed_leader(self, deadline_s: float = START_WAIT_S) -> int:
        """Waits until every running node names the same leader (after a fault, say)."""
        return until(deadline_s, "every node to name the same leader", self.agreed_leader)

    def wait_applied(self, node_id: int, index: int, deadline_s: float = START_WAIT_S) -> None:
        def applied() -> bool:
            try:
                return self.status(node_id).applied_index >= index
            except leasehold.Unavailable:
                return False

        until(deadline_s, f"node {node_id} to apply index {index}", applied)

    # ------------------------------------------------------------------ faults

    def kill(self, node_id: int) -> None:
        """SIGKILL, by the recorded process id."""
        node = self.nodes[node_id]
        if node.process is not None and node.process.poll() is None:
            os.kill(node.process.pid, signal.SIGCONT)
            node.process.kill()
            node.process.wait(timeout=30)
        node.process = None

    def restart(self, node_id: int) -> None:
        """Starts a killed node again on its data directory with the same flags."""
        self.kill(node_id)
        node = self.nodes[node_id]
        self._spawn(node)
        self._wait_listening(node)

    def pause(self, node_id: int) -> None:
        os.kill(self.nodes[node_id].pid, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        os.kill(self.nodes[node_id].pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stops every node this cluster started (SIGCONT then SIGKILL, by pid)."""
        for node_id in self.nodes:
            self.kill(node_id)

    def log_tail(self, node_id: int, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.nodes[node_id].log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
