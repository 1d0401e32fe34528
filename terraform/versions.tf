terraform {
  # 1.11: write-only arguments, so the share-link key never lands in plan or state (secrets.tf).
  required_version = ">= 1.11"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.30"
    }
    # google_project_service_identity (the service agents, created up front) is beta only.
    google-beta = {
      source  = "hashicorp/google-beta"
      version = "~> 6.30"
    }
    time = {
      source  = "hashicorp/time"
      version = "~> 0.12"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.7"
    }
    # gke.tf, only with gke_install: deploy/gke/'s manifests.
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.36"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region

  default_labels = {
    app = "mldiag"
  }
}

provider "google-beta" {
  project = var.project
  region  = var.region

  default_labels = {
    app = "mldiag"
  }
}
