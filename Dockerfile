# syntax=docker/dockerfile:1
# One image for every drill step: steps.train (PID 1 over torchrun) and steps.evict / verify / compare /
# report, all run from /app with the same code and the same Python environment.
#
#   docker build --build-arg TORCH_VARIANT=cpu  -t baton:dev-cpu  .    # kind, CI, laptops
#   docker build --build-arg TORCH_VARIANT=cuda -t baton:dev-cuda .    # GKE GPU nodes
#
# infra/scripts/build-image.sh wraps both. The CUDA wheel on PyPI carries its own CUDA runtime
# libraries (nvidia-* wheels); only the driver comes from the node, so one slim Python base serves both
# variants. BASE stays a build arg for those who must use an in-house or nvidia/cuda base.

ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# cpu: the PyTorch CPU wheel index (no multi-GB CUDA libraries). cuda: the default index, whose Linux
# x86_64 torch wheel is the CUDA build. TORCH_INDEX_URL overrides either (a mirror, a proxy).
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
# A Hugging Face model folder inside the build context, copied to /models/base. The default is a
# placeholder folder, so builds without a model need no special casing.
ARG MODEL_DIR=infra/docker/no-model

# Offline at run time: a missing local model must fail loudly, never turn into a hub download from a
# training pod (which could also silently change the weights between the reference and the trial).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HOME=/tmp/hf-home \
    MPLCONFIGDIR=/tmp/matplotlib \
    MALLOC_MMAP_THRESHOLD_=1048576

# MALLOC_MMAP_THRESHOLD_ (glibc, read at process start): buffers of 1 MiB and more are mmapped and go
# back to the OS when freed, instead of glibc raising its threshold after the first large free and
# keeping freed checkpoint-sized buffers on the heap (async saves peaked at 1.29 checkpoints without
# it, 1.06 with it: docs/results.md, figure 7). steps.train sets the same for its workers. MPLCONFIGDIR: the
# image's user 1000 has no writable home (/app is root's), and compare's plot would warn at every run.

# torch first, pinned and alone: `pip install .` below would otherwise resolve `torch==2.13.0` from
# PyPI, which is the CUDA build of several GB even for the CPU image. The check proves the variant.
RUN set -eu; \
    case "${TORCH_VARIANT}" in \
      cpu)  index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"; want_cuda=False ;; \
      cuda) index="${TORCH_INDEX_URL:-https://pypi.org/simple}"; want_cuda=True ;; \
      *) echo "TORCH_VARIANT must be cpu or cuda, got '${TORCH_VARIANT}'" >&2; exit 1 ;; \
    esac; \
    pip install --index-url "${index}" "torch==${TORCH_VERSION}"; \
    python -c "import torch; v = torch.__version__.split('+')[0]; \
assert v == '${TORCH_VERSION}', v; \
assert (torch.version.cuda is not None) == ${want_cuda}, torch.version.cuda; \
print('torch', torch.__version__, 'cuda', torch.version.cuda)"

WORKDIR /app
COPY pyproject.toml ./
COPY baton ./baton
COPY trainer ./trainer
COPY steps ./steps
COPY workflows ./workflows
COPY examples ./examples

# The project and its pinned dependencies; [gcs] adds gcsfs for gs:// buckets (s3fs is a base dep).
# torch is already satisfied (2.13.0+cpu matches ==2.13.0), and the check makes sure pip kept it.
RUN pip install ".[gcs]" \
 && python -c "import torch; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__"

# Model weights are part of the image, never fetched at run time. The tiny Qwen2 is built here from the
# shipped corpus (deterministic, no network) at the path trainer/configs/tiny.yaml names, so the default
# drill needs no model volume; MODEL_DIR bakes a real one.
# A baked model gets its manifest (trainer/weights.py): the run is then known by the weights' hash, so a
# drill on this image and one that reads the same weights from a bucket (model.path=gs://...) are one run.
COPY ${MODEL_DIR} /models/base
RUN if [ -f /models/base/config.json ]; then python -m trainer.weights manifest /models/base; fi \
 && python -m trainer.tiny /models/tiny-qwen2 --corpus trainer/assets/tiny_corpus.txt \
 && mkdir -p /app/.baton/models \
 && ln -s /models/tiny-qwen2 /app/.baton/models/tiny-qwen2

# Non-root, numeric so that runAsNonRoot can verify it. /app/.baton stays writable for local
# checkpoints (configs that point checkpoint.uri at a bucket never write there).
RUN useradd --uid 1000 --no-create-home --home-dir /app baton \
 && chown -R 1000:1000 /app/.baton
USER 1000

# PID 1 is steps.train's wrapper: it forwards SIGTERM to torchrun and maps the outcome to 0 / 75 / 1.
# Other steps override the command (python -m steps.evict ...); Argo templates should always set
# `command` so the emissary executor need not look the entrypoint up in the registry.
ENTRYPOINT ["python", "-m", "steps.train"]
CMD ["--help"]
