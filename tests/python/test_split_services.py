"""kgmesh with every service in its own process, as on Kubernetes: `kgmesh stores` starts
FalkorDB, NATS and PostgreSQL, then one `kgmesh serve <service>` per service shares them
through one config file, and an MCP client searches what was ingested through the gateway.
A lane is replaced on its own: retrieval stops, searches fail with a clear error while the
rest answers, and a new retrieval process picks up where the old one left off. The whole run
goes twice: services talking plain h2c, and with mutual TLS (`[cluster.tls]`), where a service
answers only a peer holding a certificate from the cluster's CA.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from mcp import Client

from kgmesh_support import (
    MCP_READ_TIMEOUT_S,
    REPO_ROOT,
    MeshError,
    ServiceCertificates,
    call_ok,
    call_tool,
    kgmesh_bin,
    mcp_http,
    tail,
    write_service_certificates,
)

SERVICES = ("auth", "files", "indexer", "retrieval", "graph", "ontology", "approval")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
NAMESPACE = "split"
FAQ = "# Billing FAQ\n\n## Invoices\n\nThe quarterly invoice lists the walrus surcharge separately.\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class SplitMesh:
    work: Path
    binary: Path
    processes: dict[str, Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    stores_url: dict[str, str] = field(default_factory=dict)
    stores_dir: Path | None = None
    tls: ServiceCertificates | None = None
    admin_token: str | None = None

    @property
    def config(self) -> Path:
        return self.work / "kgmesh.toml"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['gateway']}"

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        log = self.work / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(self.binary), *args],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        process = Process(name, proc, log)
        self.processes[name] = process
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{tail(p.log, 25)}" for p in self.processes.values())

    def start_stores(self) -> None:
        ready = self.work / "stores.json"
        # Run as root, PostgreSQL runs as nobody, which cannot enter pytest's private tmp dirs.
        self.stores_dir = Path(tempfile.mkdtemp(prefix="kgmesh-split-stores-"))
        self.stores_dir.chmod(0o755)
        self.spawn("stores", ["stores", "--postgres", "--data-dir", str(self.stores_dir), "--ready-file", str(ready)])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if self.processes["stores"].proc.poll() is not None or time.monotonic() > deadline:
                raise MeshError(f"`kgmesh stores` did not come up\n{self.logs()}")
            time.sleep(0.2)
        assert ready.stat().st_mode & 0o077 == 0, "the stores file holds a password: it must be private"
        self.stores_url = json.loads(ready.read_text())

    def write_config(self) -> None:
        for name in (*SERVICES, "gateway"):
            self.ports[name] = free_port()
            self.metrics_ports[name] = free_port()
        secrets_dir = self.work / "secrets"
        secrets_dir.mkdir()
        for key in ("caller-signing.key", "pat-hmac.key"):
            (secrets_dir / key).write_bytes(os.urandom(32))
            (secrets_dir / key).chmod(0o600)
        scheme = "https" if self.tls else "http"
        addr = {name: f"{scheme}://127.0.0.1:{self.ports[name]}" for name in SERVICES}
        self.config.write_text(
            f"""
data_dir = "{self.work / 'data'}"
http_addr = "127.0.0.1:{self.ports['gateway']}"
database_url = "{self.stores_url['database_url']}"
falkordb_url = "{self.stores_url['falkordb_url']}"
nats_url = "{self.stores_url['nats_url']}"

[embedding]
provider = "none"

[cluster]
auth_addr = "{addr['auth']}"
files_addr = "{addr['files']}"
retrieval_addr = "{scheme}://localhost:{self.ports['retrieval']}"
graph_addr = "{scheme}://localhost:{self.ports['graph']}"
ontology_addr = "{addr['ontology']}"
approval_addr = "{addr['approval']}"
secrets_dir = "{secrets_dir}"
blob_dir = "{self.work / 'blobs'}"
deployment_id = "split-test"
{self.tls.toml() if self.tls else ""}"""
        )

    def serve(self, name: str) -> Process:
        # What differs between processes rides in the environment, as a Deployment sets it.
        env = {
            "KGMESH_CLUSTER__LISTEN_ADDR": f"127.0.0.1:{self.ports[name]}",
            "KGMESH_CLUSTER__METRICS_ADDR": f"127.0.0.1:{self.metrics_ports[name]}",
        }
        if name == "gateway":
            env.pop("KGMESH_CLUSTER__LISTEN_ADDR")
        return self.spawn(name, ["serve", name, "--config", str(self.config)], env)

    def wait_ready(self, name: str) -> None:
        url = f"{self.base_url}/health" if name == "gateway" else f"http://127.0.0.1:{self.metrics_ports[name]}/health"
        deadline = time.monotonic() + START_TIMEOUT_S
        while http_get(url)[0] != 200:
            process = self.processes[name]
            if process.proc.poll() is not None:
                raise MeshError(f"`kgmesh serve {name}` exited with {process.proc.returncode}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise MeshError(f"`kgmesh serve {name}` not ready within {START_TIMEOUT_S}s\n{self.logs()}")
            time.sleep(0.2)

    def stop(self, name: str) -> int | None:
        """SIGTERM, as Kubernetes stops a pod; the exit code, or None if it had to be killed."""
        process = self.processes[name]
        if process.proc.poll() is None:
            process.proc.send_signal(signal.SIGTERM)
        try:
            return process.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.proc.pid, signal.SIGKILL)
            process.proc.wait()
            return None

    def stop_all(self) -> list[str]:
        problems = []
        # The gateway first and the stores last, as a rollout drains them.
        order = ["gateway", *reversed(SERVICES), "stores"]
        for name in [n for n in order if n in self.processes]:
            code = self.stop(name)
            if code != 0:
                problems.append(f"{name} did not stop cleanly on SIGTERM (exit {code})\n{tail(self.processes[name].log, 30)}")
        if self.stores_dir is not None:
            shutil.rmtree(self.stores_dir, ignore_errors=True)
        return problems

    def cli(self, *args: str, token: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args, "--url", self.base_url, "--token", token],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module", params=["h2c", "mtls"])
def split(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SplitMesh]:
    binary = kgmesh_bin()
    if not binary.is_file():
        pytest.fail(f"kgmesh binary not found at {binary}", pytrace=False)
    mesh = SplitMesh(work=tmp_path_factory.mktemp(f"split-{request.param}"), binary=binary)
    if request.param == "mtls":
        mesh.tls = write_service_certificates(mesh.work / "tls")
    try:
        mesh.start_stores()
        mesh.write_config()
        mesh.serve("auth")
        mesh.wait_ready("auth")
        for name in (*SERVICES[1:], "gateway"):
            mesh.serve(name)
        for name in (*SERVICES[1:], "gateway"):
            mesh.wait_ready(name)
    except BaseException:
        mesh.stop_all()
        raise
    yield mesh
    problems = mesh.stop_all()
    assert not problems, "\n".join(problems)


def bootstrap(split: SplitMesh) -> str:
    done = subprocess.run(
        [str(split.binary), "bootstrap-admin", "--config", str(split.config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def admin_token(split: SplitMesh) -> str:
    """The first admin's token, bootstrapped by whichever test needs it first."""
    if split.admin_token is None:
        split.admin_token = bootstrap(split)
    return split.admin_token


@pytest.mark.anyio
async def test_services_apart_ingest_and_search_and_a_lane_is_replaced_alone(split: SplitMesh) -> None:
    token = admin_token(split)
    assert token.startswith("kg_pat_"), "bootstrap-admin prints the first admin's token"
    assert bootstrap(split) == "", "a second bootstrap must not mint another admin token"

    docs = split.work / "docs"
    docs.mkdir()
    (docs / "faq.md").write_text(FAQ)
    ingested = split.cli("ingest", str(docs), "--namespace", NAMESPACE, token=token)
    assert ingested.returncode == 0, f"{ingested.stdout}\n{ingested.stderr}\n{split.logs()}"
    assert (split.work / "blobs").is_dir(), "files writes its blobs under [cluster] blob_dir"

    async with mcp_http(f"{split.base_url}/mcp", token) as client:
        found = await call_ok(client, "kg_search", {"query": "walrus surcharge", "namespaces": [NAMESPACE]})
        hits = found["results"]
        assert hits and hits[0]["path"] == "faq.md", found
        assert "walrus surcharge" in hits[0]["text"]
        assert hits[0]["citation"], "graph (another process) filled in the chunk package"

    # A TBox published over the admin REST (gateway -> ontology) after the ingest reaches the
    # file: the indexer, another process, follows the publish and extracts it again.
    tbox = split.work / "tbox.yaml"
    tbox.write_text("entity_types:\n  - type_id: fee\n    label: Fee\n    instances:\n      - name: walrus surcharge\n")
    for step in (["draft", "--file", str(tbox)], ["review"], ["publish"]):
        done = split.cli("tbox", step[0], "--namespace", NAMESPACE, *step[1:], token=token)
        assert done.returncode == 0, f"tbox {step[0]}: {done.stderr}\n{split.logs()}"
    async with mcp_http(f"{split.base_url}/mcp", token) as client:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (await call_ok(client, "kg_entity_search", {"text": "walrus", "namespaces": [NAMESPACE]}))["hits"]:
            assert time.monotonic() < deadline, f"no entity after the publish\n{split.logs()}"
            await anyio.sleep(0.25)

    # Each service process has its own /metrics; retrieval's counted the search it served.
    status, body = http_get(f"http://127.0.0.1:{split.metrics_ports['retrieval']}/metrics")
    assert status == 200, body[:300]
    assert b"kg.v1.Retrieval" in body, body.decode(errors="replace")[:1500]

    # Retrieval goes away on its own: the call fails clearly, nothing else stops.
    assert split.stop("retrieval") == 0, tail(split.processes["retrieval"].log, 30)
    async with mcp_http(f"{split.base_url}/mcp", token) as client:
        outcome = await call_tool(client, "kg_search", {"query": "walrus surcharge", "namespaces": [NAMESPACE]})
        error = outcome.error()
        assert error["code"] == "unavailable" and error["retryable"] is True, error
        assert "retrieval" in error["message"], error
        listed = await call_ok(client, "kg_namespaces", {})
        assert NAMESPACE in json.dumps(listed), listed

    # A new retrieval process (a new pod) serves the same data at once.
    split.serve("retrieval")
    split.wait_ready("retrieval")
    async with mcp_http(f"{split.base_url}/mcp", token) as client:
        found = await call_ok(client, "kg_search", {"query": "walrus surcharge", "namespaces": [NAMESPACE]})
        assert found["results"] and found["results"][0]["path"] == "faq.md", found

    # Readiness follows auth alone: without it the gateway can authorize nothing, while a lane
    # that is down (retrieval, above) still leaves the other tools to serve.
    ready = f"{split.base_url}/ready"
    assert http_get(ready) == (200, b'{"ok":true}'), http_get(ready)
    assert split.stop("auth") == 0, tail(split.processes["auth"].log, 30)
    assert http_get(ready) == (503, b'{"ok":false,"waitingFor":["auth"]}'), http_get(ready)
    assert http_get(f"{split.base_url}/health")[0] == 200, "liveness does not depend on auth"
    split.serve("auth")
    split.wait_ready("auth")
    deadline = time.monotonic() + START_TIMEOUT_S
    while http_get(ready)[0] != 200:
        assert time.monotonic() < deadline, http_get(ready)
        time.sleep(0.2)

    # Auth answering is not enough: without its database it can authorize nothing, so its
    # health says NOT_SERVING and /ready follows. PostgreSQL frozen (every one of its
    # processes stopped, as a hung server or a partitioned network), then running again.
    postgres = postgres_processes(split)
    assert postgres, "no PostgreSQL process found"
    try:
        for pid in postgres:
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while http_get(ready) != (503, b'{"ok":false,"waitingFor":["auth"]}'):
            assert time.monotonic() < deadline, f"/ready stayed {http_get(ready)} with PostgreSQL frozen"
            time.sleep(0.5)
    finally:
        for pid in postgres:
            os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while http_get(ready)[0] != 200:
        assert time.monotonic() < deadline, f"/ready stayed {http_get(ready)} with PostgreSQL running again"
        time.sleep(0.5)
    assert "store unreachable" in split.processes["auth"].log.read_text(errors="replace")
    async with mcp_http(f"{split.base_url}/mcp", token) as client:
        assert NAMESPACE in json.dumps(await call_ok(client, "kg_namespaces", {}))

    # The PostgreSQL password is in the config every process read; it reaches no log line.
    password = split.stores_url["database_url"].split(":")[2].split("@")[0]
    assert len(password) >= 8
    for process in split.processes.values():
        assert password not in process.log.read_text(errors="replace"), f"{process.name} logged the database password"


@pytest.mark.anyio
async def test_an_ontology_restart_is_quick_and_open_sessions_are_told_to_list_again(split: SplitMesh) -> None:
    """The gateway watches the ontology's compiled version over one long-lived stream. A stopping
    ontology ends it, so SIGTERM takes well under the 10 s grace it used to wait out for it (and
    calls sent meanwhile failed on the draining connection); and once the watch is back, every
    open session gets `tools/list_changed`, since a list taken while the ontology was away left
    the generated tools out."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    token = admin_token(split)
    changed = anyio.Event()

    async def on_message(message: object) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", "") == "notifications/tools/list_changed":
            changed.set()

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=MCP_READ_TIMEOUT_S)) as http:
        transport = streamable_http_client(f"{split.base_url}/mcp", http_client=http)
        client = Client(transport, mode="legacy", read_timeout_seconds=MCP_READ_TIMEOUT_S, message_handler=on_message)
        async with client:
            await client.list_tools()
            started = time.monotonic()
            assert split.stop("ontology") == 0, tail(split.processes["ontology"].log, 30)
            stopped_in = time.monotonic() - started
            assert stopped_in < 5, f"the ontology took {stopped_in:.1f}s to stop on SIGTERM"
            await client.list_tools()  # answered without generated tools while it is away
            assert not changed.is_set()
            split.serve("ontology")
            split.wait_ready("ontology")
            with anyio.fail_after(15):
                await changed.wait()


def postgres_processes(split: SplitMesh) -> list[int]:
    """The postmaster of the split mesh's PostgreSQL and every process it started."""
    assert split.stores_dir is not None
    postmaster = int((split.stores_dir / "postgres" / "pgdata" / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def first_bytes(sock: socket.socket) -> bytes:
    """What a server answers to an HTTP/2 client preface ("" when it hangs up)."""
    sock.sendall(H2_PREFACE)
    sock.settimeout(5)
    try:
        return sock.recv(64)
    except ConnectionResetError:
        return b""


def is_h2_settings(answer: bytes) -> bool:
    return len(answer) >= 9 and answer[3] == 0x04


@pytest.mark.parametrize("split", ["mtls"], indirect=True)
def test_with_tls_a_service_answers_only_peers_holding_a_certificate_from_the_cluster_ca(split: SplitMesh) -> None:
    assert split.tls is not None
    auth = ("127.0.0.1", split.ports["auth"])
    # Plaintext gRPC gets no HTTP/2 session.
    with socket.create_connection(auth, timeout=5) as sock:
        assert not is_h2_settings(first_bytes(sock)), "auth answered plaintext HTTP/2"

    def tls_context(with_certificate: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(split.tls.ca))
        context.set_alpn_protocols(["h2"])
        if with_certificate:
            context.load_cert_chain(str(split.tls.cert), str(split.tls.key))
        return context

    # TLS without a client certificate: the server ends the session before any HTTP/2.
    with socket.create_connection(auth, timeout=5) as raw:
        with tls_context(False).wrap_socket(raw, server_hostname="localhost") as sock:
            try:
                answer = first_bytes(sock)
            except ssl.SSLError as err:
                answer = b""
                assert "CERTIFICATE" in str(err).upper(), err
            assert not is_h2_settings(answer), "auth served a client without a certificate"
    # With the cluster's certificate, the same handshake reaches HTTP/2.
    with socket.create_connection(auth, timeout=5) as raw:
        with tls_context(True).wrap_socket(raw, server_hostname="localhost") as sock:
            assert sock.selected_alpn_protocol() == "h2"
            assert is_h2_settings(first_bytes(sock)), "auth refused a peer holding the cluster's certificate"


@pytest.mark.parametrize("split", ["mtls"], indirect=True)
@pytest.mark.anyio
async def test_with_tls_a_new_ca_is_taken_up_on_sighup_without_a_restart(split: SplitMesh) -> None:
    assert split.tls is not None
    token = admin_token(split)
    # Every process's files now hold a certificate from a new CA, which alone is trusted.
    rotated = write_service_certificates(split.tls.ca.parent)
    assert rotated == split.tls
    running = [name for name in (*SERVICES, "gateway") if name in split.processes]
    for name in running:
        split.processes[name].proc.send_signal(signal.SIGHUP)
    # Each process reloads on request (the 30 s check on file changes logs differently) and
    # keeps running.
    deadline = time.monotonic() + 20
    for name in running:
        process = split.processes[name]
        while "reloaded the service certificate (cluster.tls) on request" not in process.log.read_text(errors="replace"):
            assert process.proc.poll() is None, f"{name} exited on SIGHUP\n{tail(process.log, 30)}"
            assert time.monotonic() < deadline, f"{name} did not reload on SIGHUP\n{tail(process.log, 30)}"
            await anyio.sleep(0.1)
    # A retrieval started now knows only the new CA: the gateway reaches it only by dialling with
    # its reloaded certificate, and auth and graph answer the gateway's new connections only if
    # they took up the new CA too.
    assert split.stop("retrieval") == 0, tail(split.processes["retrieval"].log, 30)
    split.serve("retrieval")
    split.wait_ready("retrieval")
    docs = split.work / "rotation"
    docs.mkdir()
    (docs / "notes.md").write_text("# Rotation\n\nThe narwhal tariff applies after the certificate rotation.\n")
    ingested = split.cli("ingest", str(docs), "--namespace", "rotation", token=token)
    assert ingested.returncode == 0, f"{ingested.stdout}\n{ingested.stderr}\n{split.logs()}"
    async with mcp_http(f"{split.base_url}/mcp", token) as client:
        found = await call_ok(client, "kg_search", {"query": "narwhal tariff", "namespaces": ["rotation"]})
        assert found["results"] and found["results"][0]["citation"], found


def serve_check(service: str, config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kgmesh_bin()), "serve", service, "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_auth_keys_others_can_read_are_warned_about(tmp_path: Path) -> None:
    """Whoever reads caller-signing.key can sign an admin's caller context: a key file with
    group or other read bits is named on stderr, and the token still goes to stdout alone."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    for key in ("caller-signing.key", "pat-hmac.key"):
        (secrets_dir / key).write_bytes(os.urandom(32))
    (secrets_dir / "pat-hmac.key").chmod(0o600)
    (secrets_dir / "caller-signing.key").chmod(0o644)
    config = tmp_path / "kgmesh.toml"
    config.write_text(
        f'database_url = "sqlite://{tmp_path / "auth.db"}"\n'
        f'[cluster]\nsecrets_dir = "{secrets_dir}"\ndeployment_id = "dev"\n'
    )
    done = subprocess.run(
        [str(kgmesh_bin()), "bootstrap-admin", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kg_pat_") and done.stdout.count("\n") == 1, done.stdout
    warned = [line for line in done.stderr.splitlines() if "readable by others" in line]
    assert len(warned) == 1 and "caller-signing.key" in warned[0] and "mode 644" in warned[0], done.stderr


def test_a_service_waiting_for_auth_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    """A pod stopped before auth came up (a rollout, a scale-down) exits at SIGTERM, not
    when its 60 s wait for auth's signing key runs out, past Kubernetes' grace period."""
    config = tmp_path / "kgmesh.toml"
    config.write_text(
        'falkordb_url = "redis://127.0.0.1:1"\n[embedding]\nprovider = "none"\n'
        f'[cluster]\nauth_addr = "http://127.0.0.1:{free_port()}"\n'
    )
    env = {
        **os.environ,
        "KGMESH_CLUSTER__LISTEN_ADDR": f"127.0.0.1:{free_port()}",
        "KGMESH_CLUSTER__METRICS_ADDR": f"127.0.0.1:{free_port()}",
    }
    waiting = subprocess.Popen(
        [str(kgmesh_bin()), "serve", "retrieval", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    time.sleep(2)
    assert waiting.poll() is None, "the service should still be waiting for auth"
    waiting.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        code = waiting.wait(timeout=10)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    stderr = waiting.stderr.read().decode() if waiting.stderr else ""
    assert code == 0, (code, stderr[-2000:])
    assert time.monotonic() - started < 10, stderr[-2000:]
    # Not silent meanwhile: it says what it waits for, and where.
    assert "waiting for auth to hand out its signing key" in stderr, stderr[-2000:]


def test_serve_refuses_a_config_it_cannot_run_and_says_what_to_change(tmp_path: Path) -> None:
    config = tmp_path / "kgmesh.toml"
    config.write_text('[embedding]\nprovider = "minilm"\n[cluster]\nauth_addr = "auth:7101"\n')
    done = serve_check("retrieval", config)
    assert done.returncode == 64, (done.returncode, done.stdout, done.stderr)
    assert "cluster.auth_addr: expected http://HOST:PORT (https:// with [cluster.tls]), got `auth:7101`" in done.stderr, (
        done.stderr
    )
    config.write_text('falkordb_url = "redis://f:6379"\n[embedding]\nprovider = "minilm"\n[cluster]\nauth_addr = "http://auth:7101"\n')
    done = serve_check("retrieval", config)
    assert done.returncode == 64, (done.returncode, done.stdout, done.stderr)
    assert "vector.qdrant_url: required by `kgmesh serve retrieval`" in done.stderr, done.stderr
    config.write_text(config.read_text().replace('"minilm"', '"none"'))
    # The variables of `--project-dir` and `--warehouse-url` are flags, not config keys.
    flags = {"KGMESH_ONTOLOGY_PROJECT_DIR": str(tmp_path), "KGMESH_WAREHOUSE_URL": "sqlite://x.db"}
    done = serve_check("retrieval", config, flags)
    assert done.returncode == 0, done.stderr
    assert "0.0.0.0:7103" in done.stdout, done.stdout
    assert done.stderr == "", done.stderr


def test_serve_refuses_tls_settings_peers_would_reject_and_says_what_to_change(tmp_path: Path) -> None:
    ours = write_service_certificates(tmp_path / "ours")
    theirs = write_service_certificates(tmp_path / "theirs")
    config = tmp_path / "kgmesh.toml"
    base = 'falkordb_url = "redis://f:6379"\n[embedding]\nprovider = "none"\n[cluster]\n'
    config.write_text(base + 'auth_addr = "https://auth:7101"\n' + ours.toml())
    done = serve_check("retrieval", config)
    assert done.returncode == 0, done.stderr

    # A certificate from another CA, and a plaintext peer address beside TLS.
    mixed = ServiceCertificates(ours.ca, theirs.cert, theirs.key)
    config.write_text(base + 'auth_addr = "http://auth:7101"\n' + mixed.toml())
    done = serve_check("retrieval", config)
    assert done.returncode == 64, (done.returncode, done.stderr)
    assert "cluster.auth_addr: `http://auth:7101` is plaintext but [cluster.tls] is set" in done.stderr, done.stderr
    assert f"cluster.tls.cert_file: {theirs.cert} would be refused by the other services" in done.stderr, done.stderr
    assert "-----BEGIN" not in done.stderr, "no key or certificate material in the message"

    # A key that is not the certificate's, and https without TLS.
    config.write_text(base + 'auth_addr = "https://auth:7101"\n' + ServiceCertificates(ours.ca, ours.cert, theirs.key).toml())
    done = serve_check("retrieval", config)
    assert done.returncode == 64 and f"cluster.tls.key_file: {theirs.key} is not the key of the certificate" in done.stderr, (
        done.stderr
    )
    config.write_text(base + 'auth_addr = "https://auth:7101"\n')
    done = serve_check("retrieval", config)
    assert done.returncode == 64 and "needs TLS between services: set [cluster.tls]" in done.stderr, done.stderr
