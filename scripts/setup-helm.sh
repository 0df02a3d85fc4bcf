#!/bin/sh
# Installs real Helm v4 as the PyPI package `helm-python-sdk` (Helm's Go SDK as a C library,
# driven from Python; no helm binary) into <repo>/.cache/venv, for tests/host/helm_chart.rs and
# packaging/helm/render.py. Idempotent: does nothing when it already imports.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV="$REPO/.cache/venv"
# Parallel test processes may call this at once: one installs, the others wait.
mkdir -p "$REPO/.cache"
exec 9>"$REPO/.cache/venv.lock"
flock 9
if "$VENV/bin/python" -c 'import helm_python' >/dev/null 2>&1; then
    echo "helm-python-sdk already installed in $VENV"
    exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check helm-python-sdk
"$VENV/bin/python" -c 'import helm_python as h; print("helm SDK", h.helm_sdk_version())'
