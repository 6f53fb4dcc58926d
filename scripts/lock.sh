#!/usr/bin/env bash
# Regenerate requirements.lock: every runtime dependency of pyproject.toml (no extras) and the
# build backend, pinned with == and sha256 hashes, resolved from PyPI for Python 3.11 on Linux
# (what the container image runs). The Dockerfile installs from it with --require-hashes.
# Needs network access to PyPI; pip-tools runs from a throwaway virtual environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python_bin=${PYTHON:-python3.11}
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
# Only PyPI: a machine's own pip configuration (mirrors, local wheels) must not leak in.
export PIP_CONFIG_FILE=/dev/null
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_CONSTRAINT PIP_NO_INDEX
"$python_bin" -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install --quiet --index-url https://pypi.org/simple 'pip-tools>=7.4,<8'
"$tools/venv/bin/pip-compile" \
  --quiet \
  --index-url https://pypi.org/simple \
  --no-emit-index-url \
  --no-emit-find-links \
  --generate-hashes \
  --allow-unsafe \
  --all-build-deps \
  --strip-extras \
  --newline LF \
  --output-file requirements.lock \
  pyproject.toml
echo "wrote requirements.lock"
