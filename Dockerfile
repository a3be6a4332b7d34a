# syntax=docker/dockerfile:1
# llm-autopilot operator image.
#   docker build -t REGISTRY/llm-autopilot:TAG . && docker push REGISTRY/llm-autopilot:TAG
# tests/unit/test_image.py lints this file with hadolint and runs the two pip steps below in a venv.

# --- build: the wheel only (setuptools comes from pip's isolated build environment) ---------------------
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip wheel --no-deps -w /dist .

# --- runtime: the wheel and its dependencies from PyPI; no compilers or build tools ----------------------
FROM python:3.11-slim

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="llm-autopilot" \
      org.opencontainers.image.description="Kubernetes operator that plans, deploys and remediates vLLM workloads against a GPU memory budget" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HOME=/home/nonroot

RUN groupadd --system --gid 65532 nonroot \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home \
       --shell /usr/sbin/nologin nonroot

RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    pip install --no-cache-dir /dist/*.whl

WORKDIR /home/nonroot
EXPOSE 8080 9090 9443
USER 65532:65532

ENTRYPOINT ["llm-autopilot", "operator"]
CMD ["--liveness=http://0.0.0.0:8080/healthz", "--log-format=json"]
