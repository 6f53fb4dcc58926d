# Two stages. The builder installs requirements.lock (every package pinned with ==, each
# download checked against its sha256) into a virtual environment, then the project itself
# without dependencies; the runtime stage copies the environment and the project, and nothing
# else (no pip cache, no build leftovers). Regenerate the lock with `make lock`.

FROM python:3.11-slim AS builder

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv
COPY requirements.lock /tmp/requirements.lock
# --require-hashes: a package that is not in the lock, or whose file differs, fails the build.
RUN pip install --require-hashes --no-deps -r /tmp/requirements.lock

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
COPY hardware_catalog ./hardware_catalog
# Editable, with the locked setuptools (no build isolation: nothing unpinned is fetched), so
# alembic.ini, migrations/ and hardware_catalog/ stay next to the code at /app; `pip check`
# fails the build if the lock misses a dependency.
RUN pip install --no-deps --no-build-isolation --no-index -e . \
    && pip check


FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH

# Same paths as in the builder: the environment's scripts and the editable install point there.
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
WORKDIR /app
RUN useradd --system --uid 10001 --home-dir /app capplan \
    && mkdir -p /app/data \
    && chown capplan /app/data

USER capplan
ENV CAPPLAN_HOST=0.0.0.0 \
    CAPPLAN_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["sh", "-c", "capplan-server migrate && capplan-server catalog-sync && exec capplan-server serve"]
