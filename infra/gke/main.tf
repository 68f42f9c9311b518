# baton on GKE: a cluster with an on-demand system pool and a Spot GPU pool, a bucket for checkpoints
# and artifacts, a registry for the image, and a Google service account that only the drill's
# Kubernetes ServiceAccount can act as (Workload Identity: no key files anywhere).

locals {
  location      = var.regional ? var.region : var.zone
  bucket_name   = var.bucket_name != "" ? var.bucket_name : "${var.project_id}-baton-drills"
  workload_pool = "${var.project_id}.svc.id.goog"
  node_scopes   = ["https://www.googleapis.com/auth/cloud-platform"]
}

# The APIs a fresh project lacks. disable_on_destroy = false: turning an API off on destroy would
# break anything else in the project that uses it.
resource "google_project_service" "apis" {
  for_each = toset([
    "artifactregistry.googleapis.com",
    "compute.googleapis.com",
    "container.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
  ])
  service            = each.value
  disable_on_destroy = false
}

# ---- nodes ----

# Nodes run as their own minimal account, not the Compute Engine default (which is often Editor):
# a pod escaping to the node's metadata would otherwise get the whole project.
resource "google_service_account" "nodes" {
  account_id   = "${var.cluster_name}-nodes"
  display_name = "baton GKE nodes"
  depends_on   = [google_project_service.apis]
}

resource "google_project_iam_member" "nodes_default" {
  project = var.project_id
  role    = "roles/container.defaultNodeServiceAccount"
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_container_cluster" "this" {
  name     = var.cluster_name
  location = local.location

  # Node pools are managed below; the default pool exists only while the cluster is created.
  remove_default_node_pool = true
  initial_node_count       = 1
  deletion_protection      = var.deletion_protection
  networking_mode          = "VPC_NATIVE"
  ip_allocation_policy {}

  release_channel {
    channel = var.release_channel
  }

  # Pods get Google credentials from their Kubernetes ServiceAccount, through the GKE metadata
  # server, instead of from key files or the node's account.
  workload_identity_config {
    workload_pool = local.workload_pool
  }

  resource_labels = var.labels
  depends_on      = [google_project_service.apis]
}

resource "google_container_node_pool" "system" {
  name       = "system"
  cluster    = google_container_cluster.this.id
  location   = local.location
  node_count = var.system_node_count

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = var.system_machine_type
    service_account = google_service_account.nodes.email
    oauth_scopes    = local.node_scopes
    labels          = merge(var.labels, { "baton.dev/pool" = "system" })
    resource_labels = var.labels

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot = true
    }
  }
}

# The two GPU pools: the same machines, GPUs and taint; they differ in the fields of local.gpu_pools.
# - gpu-spot: the pool the trial is preempted on. Spot: cheap, and Compute Engine reclaims it with 30 s
#   notice, of which ordinary pods get about 15 s (GKE graceful node shutdown) -- the budget a preemption
#   save must fit in. Autoscaled from 0 so an idle cluster holds no GPU. A drill of N nodes per role holds
#   3 x N at once (docs/cluster.md, "Kueue": what the pools must allow).
# - gpu-on-demand: the baseline's pool, at size 0 until a drill asks for it (`-p baseline_pool=on-demand`:
#   reference and reference-replay land here and are never preempted, so the floor and the reference hold no
#   resumes). It costs nothing until used; while used, on-demand GPUs cost about 3x Spot (docs/drill.md,
#   "The baseline").
locals {
  gpu_pools = {
    "gpu-spot" = {
      spot      = true
      min_nodes = var.gpu_min_nodes
      max_nodes = max(var.gpu_max_nodes, 3 * var.drill_nodes)
    }
    "gpu-on-demand" = {
      spot      = false
      min_nodes = 0
      max_nodes = max(var.gpu_on_demand_max_nodes, 2 * var.drill_nodes)
    }
  }
}

resource "google_container_node_pool" "gpu" {
  for_each           = local.gpu_pools
  name               = each.key
  cluster            = google_container_cluster.this.id
  location           = local.location
  node_locations     = length(var.gpu_zones) > 0 ? var.gpu_zones : null
  initial_node_count = each.value.min_nodes

  # total_* bounds count the whole pool, and location_policy ANY lets the autoscaler take whichever
  # zone has capacity right now instead of balancing zones that have none.
  autoscaling {
    total_min_node_count = each.value.min_nodes
    total_max_node_count = each.value.max_nodes
    location_policy      = "ANY"
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = var.gpu_machine_type
    spot            = each.value.spot
    service_account = google_service_account.nodes.email
    oauth_scopes    = local.node_scopes
    labels          = merge(var.labels, { "baton.dev/pool" = each.key })
    resource_labels = var.labels

    guest_accelerator {
      type  = var.gpu_accelerator_type
      count = var.gpu_accelerator_count

      gpu_driver_installation_config {
        gpu_driver_version = var.gpu_driver_version
      }
    }

    # Only pods that tolerate this land here (the drill's training steps do); everything else stays
    # on the system pool and cannot be preempted with the trial.
    taint {
      key    = "nvidia.com/gpu"
      value  = "present"
      effect = "NO_SCHEDULE"
    }

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot = true
    }
  }

  # The autoscaler owns the size after creation.
  lifecycle {
    ignore_changes = [initial_node_count]
  }
}

# State written before the two pools became one resource keeps its pools (no destroy and re-create).
moved {
  from = google_container_node_pool.gpu
  to   = google_container_node_pool.gpu["gpu-spot"]
}

moved {
  from = google_container_node_pool.gpu_on_demand
  to   = google_container_node_pool.gpu["gpu-on-demand"]
}

# ---- storage ----

resource "google_storage_bucket" "drills" {
  name                        = local.bucket_name
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.bucket_force_destroy
  labels                      = var.labels

  # Drill checkpoints are evidence for one run; old ones only cost money.
  lifecycle_rule {
    condition {
      age = var.bucket_retention_days
    }
    action {
      type = "Delete"
    }
  }

  # Soft delete would keep every checkpoint that retention removes for another 7 days, billed.
  soft_delete_policy {
    retention_duration_seconds = 0
  }

  depends_on = [google_project_service.apis]
}

# ---- identity of the drill's pods ----

resource "google_service_account" "drill" {
  account_id   = var.gsa_account_id
  display_name = "baton drill (Workload Identity for ${var.namespace}/${var.ksa_name})"
  depends_on   = [google_project_service.apis]
}

# Exactly what the drill's pods call on the bucket, and no more (tests/unit/test_gcs_iam.py keeps this
# list equal to the store's calls): gcsfs's uploads, DCP's rename (a copy: get + create, then delete),
# and Argo's artifact uploads create objects (overwriting one also needs delete); reads, sizes and the
# copy's source get them; finding checkpoints, attempts and evidence lists them; retention and the
# rename delete them. roles/storage.objectAdmin would add object ACLs and IAM (setIamPolicy), update,
# restore and more. With BATON_GCS_HNS=1, gcsfs's storage-layout lookup needs objects.list too.
resource "google_project_iam_custom_role" "drill_objects" {
  role_id     = var.drill_role_id
  title       = "baton drill: checkpoint objects"
  description = "Create, read, list and delete objects: what baton's checkpoint store and Argo's artifacts need."
  permissions = [
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
  ]
  depends_on = [google_project_service.apis]
}

# Granted on this bucket only, never project-wide.
resource "google_storage_bucket_iam_member" "drill_objects" {
  bucket = google_storage_bucket.drills.name
  role   = google_project_iam_custom_role.drill_objects.id
  member = "serviceAccount:${google_service_account.drill.email}"
}

# Exactly one Kubernetes ServiceAccount may act as the GSA. The workload pool exists only once the
# cluster does, hence the explicit dependency.
resource "google_service_account_iam_member" "drill_workload_identity" {
  service_account_id = google_service_account.drill.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${local.workload_pool}[${var.namespace}/${var.ksa_name}]"
  depends_on         = [google_container_cluster.this]
}

# ---- the Argo UI's read access to the drill's artifacts ----

# In the Argo Server's default `client` auth mode its artifact endpoints read the bucket with the server's
# own credentials (server/artifacts/artifact_server.go), i.e. the argo-server pod's KSA: through Workload
# Identity it acts as this account, which may only read objects of this bucket. gke-up annotates the KSA.
resource "google_service_account" "ui_reader" {
  account_id   = var.ui_gsa_account_id
  display_name = "baton drill artifacts, read-only (Argo UI, ${var.argo_namespace}/argo-server)"
  depends_on   = [google_project_service.apis]
}

resource "google_storage_bucket_iam_member" "ui_reader" {
  bucket = google_storage_bucket.drills.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.ui_reader.email}"
}

resource "google_service_account_iam_member" "ui_reader_workload_identity" {
  service_account_id = google_service_account.ui_reader.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${local.workload_pool}[${var.argo_namespace}/argo-server]"
  depends_on         = [google_container_cluster.this]
}

# ---- image registry ----

resource "google_artifact_registry_repository" "images" {
  location      = var.region
  repository_id = var.registry_repository_id
  format        = "DOCKER"
  description   = "baton training/drill image"
  labels        = var.labels

  cleanup_policy_dry_run = false
  cleanup_policies {
    id     = "delete-old-untagged"
    action = "DELETE"
    condition {
      tag_state  = "UNTAGGED"
      older_than = "${var.registry_untagged_retention_days * 86400}s"
    }
  }

  depends_on = [google_project_service.apis]
}

# Nodes pull the image with their own account; read-only, and only this repository.
resource "google_artifact_registry_repository_iam_member" "nodes_pull" {
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.reader"
  member     = "serviceAccount:${google_service_account.nodes.email}"
}
