variable "project_id" {
  description = "Google Cloud project that holds the cluster, bucket, registry and service accounts. No default: it is always yours."
  type        = string
}

variable "region" {
  description = "Region for the bucket, the Artifact Registry repository and (when regional = true) the cluster."
  type        = string
  default     = "us-central1"
}

variable "zone" {
  description = "Zone of the cluster when regional = false. Pick one that offers gpu_accelerator_type: gcloud compute accelerator-types list --filter=name=nvidia-l4"
  type        = string
  default     = "us-central1-a"
}

variable "regional" {
  description = "true: a regional control plane and node pools in every zone of the region (more Spot capacity, higher cost). false: one zone (cheapest; one zonal cluster per billing account has no management fee)."
  type        = bool
  default     = false
}

variable "cluster_name" {
  description = "GKE cluster name."
  type        = string
  default     = "baton"
}

variable "release_channel" {
  description = "GKE release channel. REGULAR gets the graceful-node-shutdown and GPU driver features the drill relies on without RAPID's churn."
  type        = string
  default     = "REGULAR"

  validation {
    condition     = contains(["RAPID", "REGULAR", "STABLE"], var.release_channel)
    error_message = "release_channel must be RAPID, REGULAR or STABLE."
  }
}

variable "deletion_protection" {
  description = "GKE deletion protection. Off by default because `make gke-destroy` must be able to remove a drill cluster in one step."
  type        = bool
  default     = false
}

variable "system_machine_type" {
  description = "Machine type of the on-demand system pool (Argo controller and server, and the CPU-only evict/verify/compare/report steps)."
  type        = string
  default     = "e2-standard-4"
}

variable "system_node_count" {
  description = "Nodes per zone in the system pool. Not Spot: the workflow controller must outlive the preemptions it is watching."
  type        = number
  default     = 1
}

variable "gpu_machine_type" {
  description = "Machine type of the Spot GPU pool. g2-standard-8 carries one L4."
  type        = string
  default     = "g2-standard-8"
}

variable "gpu_accelerator_type" {
  description = "Accelerator attached to each GPU node (nvidia-l4, nvidia-tesla-t4, nvidia-a100-80gb, ...). Must match gpu_machine_type's family."
  type        = string
  default     = "nvidia-l4"
}

variable "gpu_accelerator_count" {
  description = "GPUs per node; steps.train's --nproc should equal it."
  type        = number
  default     = 1
}

variable "gpu_driver_version" {
  description = "GKE-managed NVIDIA driver: DEFAULT or LATEST installs it with the node; INSTALLATION_DISABLED leaves it to a DaemonSet you deploy."
  type        = string
  default     = "LATEST"

  validation {
    condition     = contains(["DEFAULT", "LATEST", "INSTALLATION_DISABLED"], var.gpu_driver_version)
    error_message = "gpu_driver_version must be DEFAULT, LATEST or INSTALLATION_DISABLED."
  }
}

variable "gpu_min_nodes" {
  description = "Lower bound of the GPU pool's autoscaler, over all its zones. 0 so an idle cluster costs no GPU time."
  type        = number
  default     = 0
}

variable "gpu_max_nodes" {
  description = "Upper bound of the GPU pool's autoscaler, over all its zones. A drill runs the reference, its replay and the trial at once: 3 nodes run them side by side."
  type        = number
  default     = 3

  validation {
    condition     = var.gpu_max_nodes >= 1
    error_message = "gpu_max_nodes must be at least 1, or no trial can ever be scheduled."
  }
}

variable "drill_nodes" {
  description = "Pods (GPU nodes) per role of the largest drill this cluster runs (-p nodes=N). A drill runs reference, reference-replay and trial at once, each a group of N nodes: the Spot pool allows at least 3 x N nodes, the on-demand pool 2 x N, and the Kueue ClusterQueue's GPU quotas scale by N (make gke-up writes them)."
  type        = number
  default     = 1

  validation {
    condition     = var.drill_nodes >= 1 && floor(var.drill_nodes) == var.drill_nodes
    error_message = "drill_nodes must be a whole number, at least 1."
  }
}

variable "gpu_zones" {
  description = "Zones for the GPU pool. Empty: the cluster's own zone(s). Set it when some zones of the region lack the accelerator."
  type        = list(string)
  default     = []
}

variable "namespace" {
  description = "Kubernetes namespace the drill runs in; must match templates/rbac.yaml (gke-up rewrites it when this differs)."
  type        = string
  default     = "baton"
}

variable "ksa_name" {
  description = "Kubernetes ServiceAccount of the drill's pods (templates/rbac.yaml). Workload Identity maps exactly this one to the Google service account."
  type        = string
  default     = "baton-drill"
}

variable "gsa_account_id" {
  description = "account_id of the Google service account the drill's pods act as (6-30 characters)."
  type        = string
  default     = "baton-drill"
}

variable "drill_role_id" {
  description = "role_id of the custom project role granted on the bucket (object create, get, list, delete). Custom roles are soft-deleted: within 7 days the provider undeletes the old one, but between 7 and 37 days after a gke-destroy the id is blocked: set another."
  type        = string
  default     = "batonDrillObjects"
}

variable "bucket_name" {
  description = "GCS bucket for checkpoints, evidence and Argo artifacts. Empty: <project_id>-baton-drills (bucket names are global)."
  type        = string
  default     = ""
}

variable "bucket_retention_days" {
  description = "Objects older than this many days are deleted by a lifecycle rule: drill checkpoints are evidence for one run, not an archive."
  type        = number
  default     = 14

  validation {
    condition     = var.bucket_retention_days >= 1
    error_message = "bucket_retention_days must be at least 1."
  }
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete the bucket while it still holds objects, so gke-destroy removes everything."
  type        = bool
  default     = true
}

variable "registry_repository_id" {
  description = "Artifact Registry Docker repository that holds the baton image."
  type        = string
  default     = "baton"
}

variable "registry_untagged_retention_days" {
  description = "Untagged image versions older than this are deleted by a cleanup policy (every rebuild leaves one behind)."
  type        = number
  default     = 7
}

variable "labels" {
  description = "Labels put on every resource that takes them, so the drill's cost is easy to find."
  type        = map(string)
  default = {
    app = "baton"
  }
}

variable "gpu_on_demand_max_nodes" {
  description = "Most nodes of the on-demand GPU pool (the baseline's, -p baseline_pool=on-demand). It stays at 0 until used."
  type        = number
  default     = 2
}

variable "ui_gsa_account_id" {
  description = "Google service account the Argo Server acts as to read the drill's artifacts (read-only)."
  type        = string
  default     = "baton-ui-reader"
}

variable "argo_namespace" {
  description = "Namespace of the Argo Server (its KSA argo-server reads artifacts for the UI)."
  type        = string
  default     = "argo"
}
