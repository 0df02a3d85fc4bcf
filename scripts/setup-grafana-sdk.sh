#!/bin/sh
# Installs Grafana's foundation SDK (PyPI `grafana-foundation-sdk`, pinned: the dashboard's JSON is
# its output, compared byte for byte by tests/host/grafana_dashboard.rs) into <repo>/.cache/venv, for
# tools/grafana/dashboard.py. Idempotent: does nothing when the pinned version is installed.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV="$REPO/.cache/venv"
VERSION='1769699998!10.1.0'
# Parallel test processes may call this at once: one installs, the others wait.
mkdir -p "$REPO/.cache"
exec 9>"$REPO/.cache/venv.lock"
flock 9
if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("grafana-foundation-sdk"))' 2>/dev/null)" = "$VERSION" ]; then
    echo "grafana-foundation-sdk $VERSION already installed in $VENV"
    exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "grafana-foundation-sdk==$VERSION"
"$VENV/bin/python" -c 'import grafana_foundation_sdk; print("grafana-foundation-sdk installed")'
