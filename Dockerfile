FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
COPY hardware_catalog ./hardware_catalog
# Editable install: alembic.ini, migrations/ and hardware_catalog/ stay next to the code.
RUN pip install -e . \
    && useradd --system --uid 10001 --home-dir /app capplan \
    && mkdir -p /app/data \
    && chown capplan /app/data

USER capplan
ENV CAPPLAN_HOST=0.0.0.0 \
    CAPPLAN_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["sh", "-c", "capplan-server migrate && capplan-server catalog-sync && exec capplan-server serve"]
