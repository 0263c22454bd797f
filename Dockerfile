# One image for every role: web (gunicorn, the default command), `manage.py watch`, the Celery
# worker and beat, and the one-shot migrate - docker-compose.yml picks the command per service.
#
#   docker build -t django-crd-operator .
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm -t django-crd-operator .
#
# The builder stage installs requirements.lock (every package the image runs, pinned and hashed;
# no test tools - they are in requirements-dev.lock) into a venv. The final
# stage gets only the venv and the code - no pip cache, no build tools - and runs as an
# unprivileged user (uid 10001, numeric so Kubernetes' runAsNonRoot can verify it).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
COPY requirements.lock /tmp/requirements.lock
# Every package in the lock is pinned with its hashes (pip refuses anything else, dependencies
# included: --require-hashes --no-deps). The lock is universal, so its markers pick what this
# interpreter needs (redis needs async-timeout below Python 3.11.3, e.g. Debian bookworm's
# 3.11.2). `pip check` fails the build on any inconsistency.
RUN /opt/venv/bin/pip install --require-hashes --no-deps -r /tmp/requirements.lock \
 && /opt/venv/bin/pip check

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=operator_project.settings \
    WEB_BIND=0.0.0.0:8000
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin app
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY . .
# Settings refuse to load without SECRET_KEY and DATABASE_URL when DEBUG is off; collectstatic
# needs neither for real, so it gets placeholders that never reach a running container.
RUN SECRET_KEY=collectstatic-only DATABASE_URL=postgres://collectstatic@127.0.0.1/collectstatic \
      python manage.py collectstatic --noinput -v 0 \
 && python -m compileall -q /app
USER 10001:10001
EXPOSE 8000
# gunicorn's control socket would need a writable home; nothing here uses it. Its workers share
# one metrics directory (emptied at start), so /metrics shows all of them; the watcher and the
# worker make their own (reconcilers/_base/metrics.py).
CMD ["sh", "-c", \
     "d=\"${PROMETHEUS_MULTIPROC_DIR:-/tmp/web-metrics}\" && mkdir -p \"$d\" && rm -f \"$d\"/*.db && export PROMETHEUS_MULTIPROC_DIR=\"$d\" && exec gunicorn operator_project.wsgi --bind \"$WEB_BIND\" --access-logfile - --no-control-socket"]
