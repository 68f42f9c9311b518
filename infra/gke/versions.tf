# Pinned so that `terraform init` a year from now resolves the same provider major: 7.x renamed and
# removed fields that main.tf uses. The lock file (.terraform.lock.hcl) is created by the first real
# `terraform init` and should then be committed; it could not be produced here (no provider registry).
terraform {
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.0"
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}
