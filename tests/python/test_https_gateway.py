"""The gateway serves HTTPS on its own port (`[http_tls]`), for deployments without a proxy or
ingress in front: bearer tokens must not cross a network in clear. `kgmesh up` with a
certificate answers /health and MCP over TLS to clients that trust its CA, names https URLs in
its ready file, serves no plaintext on that port, and refuses a certificate it cannot use before
anything starts."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from kgmesh_support import (
    REPO_ROOT,
    Mesh,
    ServiceCertificates,
    call_ok,
    kgmesh_bin,
    mcp_http,
    mesh_with_config,
    write_service_certificates,
)


def http_tls_toml(certificates: ServiceCertificates) -> str:
    return f'[embedding]\nprovider = "none"\n[http_tls]\ncert_file = "{certificates.cert}"\nkey_file = "{certificates.key}"\n'


@pytest.fixture(scope="module")
def https_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, ServiceCertificates]]:
    work = tmp_path_factory.mktemp("kgmesh-https")
    certificates = write_service_certificates(work / "tls")
    with mesh_with_config(work, http_tls_toml(certificates)) as running:
        yield running, certificates


@pytest.mark.anyio
async def test_the_gateway_answers_over_tls_to_clients_that_trust_its_certificate(
    https_mesh: tuple[Mesh, ServiceCertificates],
) -> None:
    mesh, certificates = https_mesh
    assert mesh.base_url.startswith("https://127.0.0.1:"), mesh.base_url
    assert mesh.mcp_url == f"{mesh.base_url}/mcp"
    trusting = ssl.create_default_context(cafile=str(certificates.ca))
    with urllib.request.urlopen(f"{mesh.base_url}/health", timeout=10, context=trusting) as response:
        assert response.status == 200
        assert json.loads(response.read())["ok"] is True

    # The official SDK over HTTPS, HTTP/2 or HTTP/1.1 as it negotiates.
    async with mcp_http(mesh.mcp_url, mesh.admin_token, verify=trusting) as client:
        listed = await call_ok(client, "kg_namespaces", {})
        assert "namespaces" in listed

    # A client that does not trust the certificate gets no answer, nor does plaintext HTTP.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{mesh.base_url}/health", timeout=10, context=ssl.create_default_context())
    address = urlparse(mesh.base_url)
    assert address.hostname and address.port
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        try:
            answer = sock.recv(64)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"HTTP/1.1 200"), answer


def test_the_cli_reaches_an_https_gateway_with_its_private_ca(https_mesh: tuple[Mesh, ServiceCertificates], tmp_path: Path) -> None:
    mesh, certificates = https_mesh
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tls.md").write_text("# TLS\n\nThe gateway terminates TLS itself.\n")
    ingest = [str(kgmesh_bin()), "ingest", str(docs), "--namespace", "tls", "--url", mesh.base_url, "--token", mesh.admin_token]
    # The variable, as a deployment sets it, is a flag's and not a config key: `up` beside it
    # would still start.
    done = subprocess.run(
        ingest, capture_output=True, text=True, timeout=300, env={**os.environ, "KGMESH_CA_FILE": str(certificates.ca)}, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Without the CA the system's roots do not know the certificate: a clear refusal.
    done = subprocess.run(ingest, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "pass --ca-file" in done.stderr, done.stderr[-2000:]


def test_a_certificate_the_gateway_cannot_serve_stops_up_before_it_starts(tmp_path: Path) -> None:
    ours = write_service_certificates(tmp_path / "ours")
    theirs = write_service_certificates(tmp_path / "theirs")
    config = tmp_path / "kgmesh.toml"
    config.write_text(http_tls_toml(ServiceCertificates(ours.ca, ours.cert, theirs.key)))
    done = subprocess.run(
        [str(kgmesh_bin()), "up", "--data-dir", str(tmp_path / "data"), "--http-addr", "127.0.0.1:0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KGMESH_CONFIG": str(config)},
        check=False,
    )
    assert done.returncode == 64, (done.returncode, done.stderr[-2000:])
    assert f"http_tls.key_file: {theirs.key} is not the key of the certificate in {ours.cert}" in done.stderr, done.stderr
    assert "-----BEGIN" not in done.stderr
    assert not (tmp_path / "data").exists(), "nothing starts on a config it refuses"
