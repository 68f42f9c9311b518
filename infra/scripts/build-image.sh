#!/usr/bin/env bash
# Build (and optionally push) the baton image, one tag per torch variant.
#
#   bash infra/scripts/build-image.sh IMAGE            # make image IMAGE=baton:dev
#
#   IMAGE      repository[:tag]; each variant is tagged <tag>-<variant> (baton:dev -> baton:dev-cpu,
#              baton:dev-cuda), so both can live in one repository.
#   VARIANTS   "cpu cuda" (default), or one of them: cpu for kind/CI, cuda for GPU nodes.
#   MODEL_DIR  a Hugging Face model folder inside the repository, baked to /models/base.
#   PUSH=1     push each tag after building it.
#   PLATFORM   target platform (default linux/amd64: GKE's g2 nodes and kind on x86 hosts).
set -euo pipefail

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2; }

[[ $# -eq 1 && -n "$1" ]] || usage
IMAGE="$1"
VARIANTS="${VARIANTS:-cpu cuda}"
PUSH="${PUSH:-0}"
PLATFORM="${PLATFORM:-linux/amd64}"
MODEL_DIR="${MODEL_DIR:-infra/docker/no-model}"

need_docker_daemon

# Split repository and tag on the last path component only: a registry host may carry a port
# (localhost:5000/baton), which is not a tag.
name="${IMAGE##*/}"
if [[ "${name}" == *:* ]]; then
  repo="${IMAGE%:*}"
  tag="${IMAGE##*:}"
else
  repo="${IMAGE}"
  tag="latest"
fi

# Docker copies only from inside the build context, and does not follow symlinks out of it; pwd -P
# resolves links, so a link pointing outside is caught here rather than by an empty /models/base.
model_abs="$(cd "${REPO_ROOT}" && cd -- "${MODEL_DIR}" 2>/dev/null && pwd -P)" \
  || die "MODEL_DIR '${MODEL_DIR}' is not a folder (relative paths are taken from ${REPO_ROOT})."
case "${model_abs}/" in
  "${REPO_ROOT}/"*) ;;
  *) die "MODEL_DIR must be inside the repository (${REPO_ROOT}); copy the model folder under it, e.g. models/NAME." ;;
esac
model_rel="${model_abs#"${REPO_ROOT}"/}"

for variant in ${VARIANTS}; do
  case "${variant}" in
    cpu | cuda) ;;
    *) die "unknown variant '${variant}' in VARIANTS (expected cpu and/or cuda)" ;;
  esac
  ref="${repo}:${tag}-${variant}"
  log "building ${ref} (torch variant ${variant}, model ${model_rel})"
  docker build \
    --platform "${PLATFORM}" \
    --file "${REPO_ROOT}/Dockerfile" \
    --build-arg "TORCH_VARIANT=${variant}" \
    --build-arg "MODEL_DIR=${model_rel}" \
    --label "org.opencontainers.image.revision=$(default_image_tag)" \
    --tag "${ref}" \
    "${REPO_ROOT}"
  if [[ "${PUSH}" == "1" ]]; then
    log "pushing ${ref}"
    docker push "${ref}"
  fi
  printf '%s\n' "${ref}"
done
