#!/usr/bin/env bash
# make gke-up: everything the drill needs on Google Cloud, from an empty project to a submit-ready
# cluster. Safe to re-run: each step converges (terraform apply, server-side apply, ensure_namespace).
#
#   PROJECT=my-project make gke-up
#
#   PROJECT       Google Cloud project (default: GOOGLE_CLOUD_PROJECT, then gcloud's configured project)
#   REGION, ZONE  default us-central1 / us-central1-a; REGIONAL=true for a regional cluster
#   AUTO_APPROVE  1: apply the Terraform plan without asking
#   IMAGE_TAG     tag for the pushed image (default: the commit, "-dirty" with local changes)
#   SKIP_IMAGE    1: do not build or push the image (IMAGE in values.env then names the tag to push)
#   KUEUE         1: apply templates/overlays/gke-kueue instead (Kueue must be installed already)
#
# Steps: 1 terraform apply (infra/gke) -> 2 kubectl credentials -> 3 Argo Workflows (pinned) ->
# 4 namespace -> 5 build and push the CUDA image -> 6 the gke overlay, with the cluster's values written from
# Terraform's outputs into its generated Component (RBAC with the Workload Identity annotation, Argo's
# artifact repository in the bucket, the nightly CronWorkflow), and the argo-server's read access for the
# UI -> 7 templates/overlays/gke/values.env.
set -euo pipefail

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TF_DIR="${REPO_ROOT}/infra/gke"
VALUES="${REPO_ROOT}/templates/overlays/gke/values.env"

need terraform "Install Terraform >= 1.5 (https://developer.hashicorp.com/terraform/install)."
need gcloud "Install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and run 'gcloud auth login' and 'gcloud auth application-default login'."
need kubectl "Install kubectl ('gcloud components install kubectl')."
need gke-gcloud-auth-plugin "kubectl needs it for GKE: 'gcloud components install gke-gcloud-auth-plugin'."
if [[ "${SKIP_IMAGE:-0}" != "1" ]]; then
  need_docker_daemon
fi

PROJECT="${PROJECT:-${GOOGLE_CLOUD_PROJECT:-$(gcloud config get-value project 2>/dev/null || true)}}"
[[ -n "${PROJECT}" ]] || die "no project: set PROJECT=<project id> (or 'gcloud config set project ...')."
REGION="${REGION:-us-central1}"
ZONE="${ZONE:-us-central1-a}"
REGIONAL="${REGIONAL:-false}"
[[ "${REGIONAL}" == "true" || "${REGIONAL}" == "false" ]] || die "REGIONAL must be true or false."

# --- 1. infrastructure ---------------------------------------------------------------------------
# The inputs go into an auto-loaded tfvars file (gitignored), so gke-destroy.sh and plain terraform
# commands in infra/gke act on the same project without being told again.
log "1/7 terraform apply in infra/gke (project ${PROJECT})"
cat >"${TF_DIR}/baton.auto.tfvars.json" <<JSON
{"project_id": "${PROJECT}", "region": "${REGION}", "zone": "${ZONE}", "regional": ${REGIONAL}}
JSON
terraform -chdir="${TF_DIR}" init -input=false
if [[ "${AUTO_APPROVE:-0}" == "1" ]]; then
  terraform -chdir="${TF_DIR}" apply -input=false -auto-approve
else
  terraform -chdir="${TF_DIR}" apply
fi

tf_out() { terraform -chdir="${TF_DIR}" output -raw "$1"; }
CLUSTER="$(tf_out cluster_name)"
LOCATION="$(tf_out cluster_location)"
BUCKET="$(tf_out bucket)"
BUCKET_URL="$(tf_out bucket_url)"
REGISTRY="$(tf_out registry_url)"
GSA_EMAIL="$(tf_out gsa_email)"
NAMESPACE="$(tf_out namespace)"
KSA="$(tf_out ksa_name)"

# --- 2. cluster credentials ----------------------------------------------------------------------
log "2/7 kubectl credentials for ${CLUSTER} (${LOCATION})"
gcloud container clusters get-credentials "${CLUSTER}" --location "${LOCATION}" --project "${PROJECT}"

# --- 3. Argo Workflows ---------------------------------------------------------------------------
log "3/7 Argo Workflows ${ARGO_VERSION}"
install_argo

# --- 4. namespace -------------------------------------------------------------------------------
log "4/7 namespace ${NAMESPACE}"
[[ "${NAMESPACE}" == "baton" ]] || die "terraform's namespace is ${NAMESPACE}; the overlays are written for baton."
ensure_namespace "${NAMESPACE}"

# --- 5. image ------------------------------------------------------------------------------------
TAG="${IMAGE_TAG:-$(default_image_tag)}"
IMAGE="${REGISTRY}/baton:${TAG}-cuda"
if [[ "${SKIP_IMAGE:-0}" == "1" ]]; then
  log "5/7 SKIP_IMAGE=1: not building; values.env names ${IMAGE}"
else
  log "5/7 build and push ${IMAGE}"
  gcloud auth configure-docker "${REGISTRY%%/*}" --quiet
  VARIANTS=cuda PUSH=1 bash "${REPO_ROOT}/infra/scripts/build-image.sh" "${REGISTRY}/baton:${TAG}"
fi

# --- 6. the gke overlay ------------------------------------------------------------------------
# RBAC (the pods' KSA, annotated for Workload Identity, and the submitter), Argo's artifact repository in
# the bucket, and the nightly CronWorkflow. The cluster's values come from Terraform's outputs into the
# overlay's generated Component (git-ignored), so the committed overlay never holds a placeholder; the
# argo-server's KSA reads artifacts for the UI as the read-only account.
log "6/7 the ${KUEUE:+Kueue }gke overlay: RBAC, ${KSA} -> ${GSA_EMAIL}, artifact repository -> gs://${BUCKET}, nightly drill"
OVERLAY="gke"
[[ "${KUEUE:-0}" == "1" ]] && OVERLAY="gke-kueue"
terraform -chdir="${TF_DIR}" output -json >"${TF_DIR}/outputs.json"
python3 "${REPO_ROOT}/infra/scripts/cluster_overlay.py" "${TF_DIR}/outputs.json" --image "${IMAGE}"
apply_overlay "${OVERLAY}"
kubectl -n argo annotate --overwrite serviceaccount argo-server "iam.gke.io/gcp-service-account=$(tf_out ui_gsa_email)"

# --- 7. overlay values ---------------------------------------------------------------------------
log "7/7 writing ${VALUES#"${REPO_ROOT}"/}"
mkdir -p "$(dirname "${VALUES}")"
cat >"${VALUES}" <<ENV
# Written by infra/scripts/gke-up.sh; read by the gke overlay and the drill's submit. Not committed:
# it names one person's project. Regenerate with 'make gke-up'.
PROVIDER=gke
PROJECT=${PROJECT}
REGION=${REGION}
CLUSTER=${CLUSTER}
CLUSTER_LOCATION=${LOCATION}
NAMESPACE=${NAMESPACE}
SERVICE_ACCOUNT=${KSA}
GSA_EMAIL=${GSA_EMAIL}
BUCKET=${BUCKET}
BUCKET_URL=${BUCKET_URL}
IMAGE=${IMAGE}
ARGO_VERSION=${ARGO_VERSION}
ENV

log "done. The drill can be submitted to namespace ${NAMESPACE} with image ${IMAGE} and bucket ${BUCKET_URL},"
log "rendered with the ${OVERLAY} overlay: paste this (with ARGO_SERVER and ARGO_TOKEN, docs/cluster.md), then"
log "'python workflows/equivalence.py submit':"
printf 'export BATON_TARGET=%s\n' "${OVERLAY}"
