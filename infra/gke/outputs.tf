# Read by infra/scripts/gke-up.sh (terraform output -raw NAME) to configure kubectl, Argo and the
# overlay. A sibling provider folder (infra/eks, ...) must expose the same names.

output "project_id" {
  description = "Project that holds everything."
  value       = var.project_id
}

output "region" {
  description = "Region of the bucket and the registry."
  value       = var.region
}

output "cluster_name" {
  description = "GKE cluster name (gcloud container clusters get-credentials NAME --location LOCATION)."
  value       = google_container_cluster.this.name
}

output "cluster_location" {
  description = "Zone or region of the cluster."
  value       = google_container_cluster.this.location
}

output "bucket" {
  description = "Bucket name for checkpoints, evidence and Argo artifacts."
  value       = google_storage_bucket.drills.name
}

output "bucket_url" {
  description = "fsspec URL of the bucket (gs://...), the root the drill writes under."
  value       = "gs://${google_storage_bucket.drills.name}"
}

output "registry_url" {
  description = "Docker repository to push the image to: REGION-docker.pkg.dev/PROJECT/REPO."
  value       = "${google_artifact_registry_repository.images.location}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
}

output "gsa_email" {
  description = "Google service account the drill's pods act as; goes into the KSA's iam.gke.io/gcp-service-account annotation."
  value       = google_service_account.drill.email
}

output "namespace" {
  description = "Kubernetes namespace of the drill."
  value       = var.namespace
}

output "ksa_name" {
  description = "Kubernetes ServiceAccount bound to gsa_email."
  value       = var.ksa_name
}

output "ui_gsa_email" {
  description = "Google service account the argo-server KSA acts as to read artifacts (its iam.gke.io/gcp-service-account annotation)."
  value       = google_service_account.ui_reader.email
}

output "drill_nodes" {
  description = "Pods per role of the largest drill the pools and the Kueue quota allow (make gke-up scales the ClusterQueue by it)."
  value       = var.drill_nodes
}
