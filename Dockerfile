# syntax=docker/dockerfile:1
# One image for every Tessera service: `tessera <service>` (inventory, placer, binder,
# deviceplugin, dashboard); the Helm chart passes the service and its settings as arguments.
#
#   docker build -t REGISTRY/tessera:0.1.0 .
#   docker run --rm REGISTRY/tessera:0.1.0 placer --help
#
# Stage 1 builds the package and its dependencies into a virtual environment; stage 2 carries
# only that environment onto a clean base, without pip caches, sources or build tools.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY shared ./shared
COPY services ./services
COPY tessera ./tessera
# Not editable, bytecode compiled now: the containers run on a read-only root filesystem. The
# dependencies at the versions CI tested (requirements.lock, as pip constraints).
RUN python -m venv /opt/tessera \
    && /opt/tessera/bin/pip install -c requirements.lock . \
    && /opt/tessera/bin/python -m compileall -q /opt/tessera/lib \
    && /opt/tessera/bin/tessera --help >/dev/null

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="GPU sharing for Kubernetes: inventory, placer, binder, device plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric user, so that Kubernetes can check runAsNonRoot; the chart runs every service
# but the device plugin as this user (the device plugin needs root for the kubelet's socket
# directory, see the chart).
RUN groupadd --system --gid 10001 tessera \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin tessera
COPY --from=build /opt/tessera /opt/tessera
ENV PATH=/opt/tessera/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
ENTRYPOINT ["tessera"]
CMD ["--help"]
