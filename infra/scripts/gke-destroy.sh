#!/usr/bin/env bash
# make gke-destroy: remove everything gke-up.sh created. Argo, the namespace and every pod go with the
# cluster; the bucket (force_destroy) goes with its objects, the registry with its images.
#
#   AUTO_APPROVE  1: destroy without asking
#
# The project, region and zone are read from infra/gke/baton.auto.tfvars.json, which gke-up.sh wrote.
set -euo pipefail

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TF_DIR="${REPO_ROOT}/infra/gke"
VALUES="${REPO_ROOT}/templates/overlays/gke/values.env"

need terraform "Install Terraform >= 1.5 (https://developer.hashicorp.com/terraform/install)."
[[ -f "${TF_DIR}/baton.auto.tfvars.json" ]] \
  || die "infra/gke/baton.auto.tfvars.json is missing: nothing was created from this checkout (or run gke-up.sh's terraform step by hand first)."

tf_out() { terraform -chdir="${TF_DIR}" output -raw "$1" 2>/dev/null || true; }
PROJECT="$(tf_out project_id)"
CLUSTER="$(tf_out cluster_name)"
LOCATION="$(tf_out cluster_location)"
NAMESPACE="$(tf_out namespace)"

# Stop running drills first, so no pod keeps writing to the bucket while Terraform empties it.
# Best effort: a half-created cluster or missing credentials must not block the destroy.
if [[ -n "${CLUSTER}" ]] && command -v kubectl >/dev/null 2>&1; then
  context="gke_${PROJECT}_${LOCATION}_${CLUSTER}"
  if kubectl config get-contexts -o name 2>/dev/null | grep -qx "${context}"; then
    log "stopping workflows in ${NAMESPACE} (${context})"
    kubectl --context "${context}" -n "${NAMESPACE}" delete workflows.argoproj.io --all --wait=false \
      --request-timeout=30s || true
  fi
fi

log "terraform destroy in infra/gke"
terraform -chdir="${TF_DIR}" init -input=false
if [[ "${AUTO_APPROVE:-0}" == "1" ]]; then
  terraform -chdir="${TF_DIR}" destroy -input=false -auto-approve
else
  terraform -chdir="${TF_DIR}" destroy
fi

# Local traces of the cluster: the kubeconfig entry and the overlay values that point at it.
if [[ -n "${CLUSTER}" ]] && command -v kubectl >/dev/null 2>&1; then
  context="gke_${PROJECT}_${LOCATION}_${CLUSTER}"
  kubectl config delete-context "${context}" >/dev/null 2>&1 || true
  kubectl config delete-cluster "${context}" >/dev/null 2>&1 || true
  kubectl config delete-user "${context}" >/dev/null 2>&1 || true
fi
rm -f "${VALUES}" "${TF_DIR}/baton.auto.tfvars.json" "${TF_DIR}/outputs.json"
rm -rf "${REPO_ROOT}/templates/overlays/gke/generated-by-make-gke-up"
log "done: cluster, node pools, bucket, registry, service accounts and local overlay values and the generated overlay Component removed."
