#!/usr/bin/env bash
# make e2e-kind: the drill end to end on a local kind cluster, CPU only. kind cluster -> CPU image
# loaded into it -> Argo Workflows (pinned) -> MinIO as the bucket -> the kind overlay (RBAC, Argo
# artifact repository, nightly CronWorkflow) -> submit the drill as baton-submitter -> wait -> print the
# compare step's report.
#
#   KIND_CLUSTER      cluster name (default baton-e2e); reused when it exists
#   KIND_NODE_IMAGE   kindest/node image to pin the Kubernetes version (default: kind's own)
#   E2E_TIMEOUT       seconds to wait for the workflow (default 3600)
#   SUBMIT_ARGS       extra arguments for 'workflows/equivalence.py submit' (e.g. -p evictions=2)
#   KEEP_CLUSTER      0: delete the cluster at the end (default 1: keep it for inspection)
set -euo pipefail

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER="${KIND_CLUSTER:-baton-e2e}"
NAMESPACE="baton"
KSA="baton-drill"
SUBMITTER="baton-submitter"  # templates/base/rbac.yaml: may create and read workflows, nothing else
BUCKET="baton"
TIMEOUT="${E2E_TIMEOUT:-3600}"
VALUES="${REPO_ROOT}/templates/overlays/kind/values.env"

# Everything is checked before anything is created: this needs a Docker daemon, which CI sandboxes
# and this project's development machine do not have.
need_docker_daemon
need kind "Install kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)."
need kubectl "Install kubectl (https://kubernetes.io/docs/tasks/tools/)."
PY="$(repo_python)"
[[ -f "${REPO_ROOT}/workflows/equivalence.py" ]] || die "workflows/equivalence.py is missing."
"${PY}" "${REPO_ROOT}/workflows/equivalence.py" submit --help >/dev/null \
  || die "'workflows/equivalence.py submit --help' failed; run 'make install' first."

# --- cluster and image ---------------------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
  log "reusing kind cluster ${CLUSTER}"
else
  log "creating kind cluster ${CLUSTER}"
  kind create cluster --name "${CLUSTER}" ${KIND_NODE_IMAGE:+--image "${KIND_NODE_IMAGE}"} --wait 120s
fi
kubectl config use-context "kind-${CLUSTER}" >/dev/null
if [[ "${KEEP_CLUSTER:-1}" == "0" ]]; then
  trap 'kind delete cluster --name "${CLUSTER}"' EXIT
fi

IMAGE="baton:e2e-cpu"
log "building ${IMAGE} and loading it into the cluster (no registry involved)"
VARIANTS=cpu bash "${REPO_ROOT}/infra/scripts/build-image.sh" "baton:e2e" >/dev/null
kind load docker-image "${IMAGE}" --name "${CLUSTER}"

# --- Argo, namespace ------------------------------------------------------------------------------
install_argo
ensure_namespace "${NAMESPACE}"

# --- MinIO ---------------------------------------------------------------------------------------
# Random credentials, created once: MinIO keeps the root user it first started with, so rotating the
# Secret under a running MinIO would lock every step out.
if ! kubectl -n "${NAMESPACE}" get secret baton-minio >/dev/null 2>&1; then
  access="baton-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  secret="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
  kubectl -n "${NAMESPACE}" create secret generic baton-minio \
    --from-literal=accesskey="${access}" --from-literal=secretkey="${secret}" \
    --from-literal=AWS_ACCESS_KEY_ID="${access}" --from-literal=AWS_SECRET_ACCESS_KEY="${secret}"
fi
kubectl -n "${NAMESPACE}" apply -f "${REPO_ROOT}/infra/kind/minio.yaml"
kubectl -n "${NAMESPACE}" rollout status deployment/minio --timeout=300s
kubectl -n "${NAMESPACE}" wait --for=condition=complete job/minio-make-bucket --timeout=300s

# The kind overlay: both ServiceAccounts and Roles, Argo's artifact repository (the same MinIO, for the
# report's JSON and PNG), and the nightly CronWorkflow.
apply_overlay kind
mkdir -p "$(dirname "${VALUES}")"
cat >"${VALUES}" <<ENV
# Written by infra/scripts/e2e-kind.sh; not committed. The steps reach MinIO through BATON_S3_ENDPOINT
# and the AWS_* keys of Secret S3_CREDENTIALS_SECRET.
PROVIDER=kind
CLUSTER=${CLUSTER}
NAMESPACE=${NAMESPACE}
SERVICE_ACCOUNT=${KSA}
BUCKET=${BUCKET}
BUCKET_URL=s3://${BUCKET}
S3_ENDPOINT=http://minio.${NAMESPACE}.svc:9000
S3_CREDENTIALS_SECRET=baton-minio
IMAGE=${IMAGE}
ARGO_VERSION=${ARGO_VERSION}
ENV

# --- the drill -----------------------------------------------------------------------------------
log "submitting the equivalence drill through the Argo server"
# submit speaks to the Argo server's API, as the Argo CLI does: port-forward it and send a token of the
# submitter ServiceAccount (the server's default `client` auth mode calls Kubernetes with it; the pods'
# baton-drill may not create workflows). The kind overlay adds MinIO's endpoint and keys to every step.
kubectl -n argo port-forward svc/argo-server 2746:2746 >/dev/null 2>&1 &
PF_PID=$!
trap 'kill "${PF_PID}" 2>/dev/null || true' EXIT
sleep 3
export ARGO_SERVER=localhost:2746 ARGO_NAMESPACE="${NAMESPACE}" ARGO_INSECURE_SKIP_VERIFY=true
ARGO_TOKEN="Bearer $(kubectl -n "${NAMESPACE}" create token "${SUBMITTER}")"
export ARGO_TOKEN
# shellcheck disable=SC2086 # SUBMIT_ARGS is a word list on purpose
WF="$(BATON_TARGET=kind "${PY}" "${REPO_ROOT}/workflows/equivalence.py" submit \
    -p "image=${IMAGE}" -p "bucket=s3://${BUCKET}" ${SUBMIT_ARGS:-} | head -n 1)"
[[ -n "${WF}" ]] || die "submit printed no workflow name."

log "waiting for ${WF} (up to ${TIMEOUT}s)"
deadline=$((SECONDS + TIMEOUT))
phase=""
while ((SECONDS < deadline)); do
  phase="$(kubectl -n "${NAMESPACE}" get workflows.argoproj.io "${WF}" -o jsonpath='{.status.phase}')"
  case "${phase}" in
    Succeeded | Failed | Error) break ;;
  esac
  sleep 10
done
log "${WF}: ${phase:-no phase}"

# The compare step writes the report: its verdict on stdout, report.json / report.md / loss.png as
# Argo artifacts and under s3://${BUCKET}/drills/${WF}/report in MinIO.
report_pod="$(kubectl -n "${NAMESPACE}" get pods -l "workflows.argoproj.io/workflow=${WF}" -o json \
  | "${PY}" -c 'import json, sys
pods = json.load(sys.stdin)["items"]
names = [p["metadata"]["name"] for p in pods
         if p["metadata"].get("annotations", {}).get("workflows.argoproj.io/node-name", "").endswith(".compare")]
print(names[-1] if names else "")')"
if [[ -n "${report_pod}" ]]; then
  kubectl -n "${NAMESPACE}" logs "${report_pod}" -c main
else
  log "no compare pod found; the workflow's nodes:"
  kubectl -n "${NAMESPACE}" get workflows.argoproj.io "${WF}" -o jsonpath='{range .status.nodes.*}{.displayName}{"\t"}{.phase}{"\t"}{.message}{"\n"}{end}'
fi
[[ "${phase}" == "Succeeded" ]] || die "workflow ${WF} ended ${phase:-without a phase (timed out)}"
