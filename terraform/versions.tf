terraform {
  # 1.11: write-only arguments, so the share-link key never lands in plan or state (secrets.tf).
  required_version = ">= 1.11"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.30"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.7"
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
