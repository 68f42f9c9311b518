# shellcheck shell=bash
# Shared by the infra scripts (sourced, not run). Pins and helpers that must agree between gke-up.sh,
# gke-destroy.sh and e2e-kind.sh live here once.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
export REPO_ROOT

# The pinned versions' one home: ARGO_VERSION (the release `make e2e` runs on the local control plane) and
# ARGO_INSTALL_SHA256, the digest of its install manifest, which every cluster path applies.
# shellcheck source=SCRIPTDIR/../local/versions.env
source "${REPO_ROOT}/infra/local/versions.env"
ARGO_INSTALL="${REPO_ROOT}/infra/argo/install.yaml"
ARGO_NAMESPACE="argo"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# need TOOL "how to get it": fail before doing anything when a tool is missing, instead of halfway
# through creating cloud resources.
need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not on PATH. $2"
}

need_docker_daemon() {
  need docker "Install Docker (https://docs.docker.com/engine/install/)."
  docker info >/dev/null 2>&1 \
    || die "docker is installed but its daemon is not reachable (docker info failed). Start Docker, or check DOCKER_HOST."
}

# The Python the repository's tooling runs with: the project venv when present.
repo_python() {
  if [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
    printf '%s\n' "${REPO_ROOT}/.venv/bin/python"
  else
    command -v python3 || die "no Python found; run 'make install' first."
  fi
}

# Idempotent namespace creation (create fails when it exists; apply of a generated object does not).
ensure_namespace() {
  kubectl create namespace "$1" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
}

# The release's install manifest (infra/argo/install.yaml, rendered from the verified module by
# infra/scripts/argo_install.py), refused unless its sha256 is the pinned one. Server-side apply, as Argo's
# docs ask: a full CRD is too large for client-side apply's last-applied annotation.
install_argo() {
  local got
  got="$(sha256sum "${ARGO_INSTALL}" | cut -d' ' -f1)"
  [[ "${got}" == "${ARGO_INSTALL_SHA256}" ]] \
    || die "${ARGO_INSTALL} has sha256 ${got}, not the pinned ARGO_INSTALL_SHA256 ${ARGO_INSTALL_SHA256} (infra/local/versions.env); nothing was installed. 'python3 -m infra.scripts.argo_install check' says why."
  log "installing Argo Workflows ${ARGO_VERSION} (sha256 ${got:0:12}...) into namespace ${ARGO_NAMESPACE}"
  ensure_namespace "${ARGO_NAMESPACE}"
  kubectl apply --server-side --force-conflicts -n "${ARGO_NAMESPACE}" -f "${ARGO_INSTALL}"
  kubectl -n "${ARGO_NAMESPACE}" rollout status deployment/workflow-controller --timeout=300s
}

# An overlay (RBAC, artifact repository, nightly CronWorkflow) into namespace baton, the overlays'
# namespace, as it is: the gke overlays hold no placeholder (gke-up.sh writes their cluster values first).
apply_overlay() {
  local overlay="$1"
  ensure_namespace baton
  kubectl apply -k "${REPO_ROOT}/templates/overlays/${overlay}"
}

# Tag of the image built from this checkout: the commit, marked when the tree has local changes so a
# pushed tag never claims to be a commit it is not.
default_image_tag() {
  local rev
  rev="$(git -C "${REPO_ROOT}" rev-parse --short=12 HEAD 2>/dev/null || echo dev)"
  if [[ -n "$(git -C "${REPO_ROOT}" status --porcelain 2>/dev/null)" ]]; then
    rev="${rev}-dirty"
  fi
  printf '%s\n' "${rev}"
}
