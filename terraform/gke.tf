# mldiag on a GKE cluster (gke_install, off by default): the manifests of deploy/gke/, the
# same files kustomize applies, with their example values replaced, and a Google service
# account for kube-discover bound to its Kubernetes one by Workload Identity.

locals {
  gke_files = ["namespace.yaml", "networkpolicy.yaml", "serviceaccount.yaml", "rbac.yaml", "discover.yaml", "webhook.yaml"]
  gke_raw   = join("\n---\n", [for f in local.gke_files : file("${path.module}/../deploy/gke/${f}")])
  gke_sa    = try(google_service_account.gke_discover[0].email, "")
  gke_t1    = replace(local.gke_raw, "mldiag-discover@example-project.iam.gserviceaccount.com", local.gke_sa)
  gke_t2    = replace(local.gke_t1, "us-docker.pkg.dev/example-project/mldiag/mldiag@sha256:0000000000000000000000000000000000000000000000000000000000000000", var.gke_image)
  gke_t3    = replace(local.gke_t2, "example-workloads", var.gke_workload_namespace)
  gke_t4    = replace(local.gke_t3, "example-run", var.gke_run)
  gke_text  = replace(local.gke_t4, "example-project", var.project)
  gke_docs  = [for text in split("\n---\n", local.gke_text) : yamldecode(text) if trimspace(text) != ""]
  gke_manifests = var.gke_install ? {
    for doc in local.gke_docs : "${doc.kind}/${lookup(doc.metadata, "namespace", "")}/${doc.metadata.name}" => doc
  } : {}
}

resource "google_service_account" "gke_discover" {
  count        = var.gke_install ? 1 : 0
  account_id   = "${var.prefix}-gke-discover"
  display_name = "mldiag kube-discover (GKE, Workload Identity)"
  depends_on   = [google_project_service.apis]
}

# What `mldiag profiler-target create` needs: the run and its targets in Firestore.
resource "google_project_iam_member" "gke_discover_firestore" {
  count   = var.gke_install ? 1 : 0
  project = var.project
  role    = "roles/datastore.user"
  member  = "serviceAccount:${google_service_account.gke_discover[0].email}"
}

resource "google_service_account_iam_member" "gke_discover_workload_identity" {
  count              = var.gke_install ? 1 : 0
  service_account_id = google_service_account.gke_discover[0].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project}.svc.id.goog[mldiag/mldiag-discover]"
}

data "google_container_cluster" "gke" {
  count    = var.gke_install ? 1 : 0
  name     = var.gke_cluster.name
  location = var.gke_cluster.location
}

data "google_client_config" "gke" {}

provider "kubernetes" {
  host                   = var.gke_install ? "https://${data.google_container_cluster.gke[0].endpoint}" : null
  token                  = var.gke_install ? data.google_client_config.gke.access_token : null
  cluster_ca_certificate = var.gke_install ? base64decode(data.google_container_cluster.gke[0].master_auth[0].cluster_ca_certificate) : null
}

resource "kubernetes_manifest" "gke" {
  for_each = local.gke_manifests
  manifest = each.value
}
