#!/usr/bin/env bash
# Set up, migrate the database (SQLite by default), load the hardware catalog, and serve
# the API on http://127.0.0.1:8000 (Swagger UI at /docs, ReDoc at /redoc).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/capplan-server migrate
.venv/bin/capplan-server catalog-sync
exec .venv/bin/capplan-server serve "$@"
