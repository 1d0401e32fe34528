# The profile bucket: the standard XProf logdir layout (<run>/plugins/profile/<session>/) with
# the xplanes and, under analysis/, the reports; the viewer's caches under xprof-cache/. Every finalized object is an event for
# on_profile_object (functions.tf).
resource "google_storage_bucket" "profiles" {
  name     = local.bucket_name
  location = var.region
  # The Eventarc trigger must live in the bucket's location: keep both regional.

  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  # A profile overwritten by mistake (same host, same session) stays recoverable for a while.
  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_version_retention_days
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 1
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }

  dynamic "lifecycle_rule" {
    for_each = var.profile_nearline_after_days > 0 ? [var.profile_nearline_after_days] : []
    content {
      condition {
        age                   = lifecycle_rule.value
        matches_storage_class = ["STANDARD"]
      }
      action {
        type          = "SetStorageClass"
        storage_class = "NEARLINE"
      }
    }
  }

  # The XProf viewer's caches (xprof-cache/, about 1.5 bytes per profile byte) expire; the
  # console has them rebuilt on the next open (mldiag.viewer_cache.expired). A deleted cache
  # object is never worth recovering: its noncurrent version goes the next day.
  dynamic "lifecycle_rule" {
    for_each = var.viewer_cache_retention_days > 0 ? [var.viewer_cache_retention_days] : []
    content {
      condition {
        age            = lifecycle_rule.value
        matches_prefix = ["${local.viewer_cache_root}/"]
        with_state     = "LIVE"
      }
      action {
        type = "Delete"
      }
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 1
      matches_prefix             = ["${local.viewer_cache_root}/"]
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  # Superseded objects: the pipeline marks them with a customTime when a newer version of
  # their session is reported (mldiag.retention.mark_superseded), and nothing else sets one.
  dynamic "lifecycle_rule" {
    for_each = var.superseded_retention_days > 0 ? [var.superseded_retention_days] : []
    content {
      condition {
        days_since_custom_time = lifecycle_rule.value
        with_state             = "LIVE"
      }
      action {
        type = "Delete"
      }
    }
  }

  # The raw profiles (<run>/plugins/profile/<session>/<host>.xplane.pb, at any prefix), kept
  # apart from the reports beside them, which are small. Once they go, a session's report
  # stays and its viewer can no longer be rebuilt.
  dynamic "lifecycle_rule" {
    for_each = var.raw_profile_retention_days > 0 ? [var.raw_profile_retention_days] : []
    content {
      condition {
        age            = lifecycle_rule.value
        matches_suffix = local.profile_suffixes
        with_state     = "LIVE"
      }
      action {
        type = "Delete"
      }
    }
  }

  dynamic "lifecycle_rule" {
    for_each = var.profile_retention_days > 0 ? [var.profile_retention_days] : []
    content {
      condition {
        age        = lifecycle_rule.value
        with_state = "LIVE"
      }
      action {
        type = "Delete"
      }
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
  #checkov:skip=CKV_GCP_62:Access is recorded by Cloud Storage Data Access audit logs (google_project_iam_audit_config.storage), the successor of bucket usage logs; a log bucket would need a log bucket of its own.
}

# Function sources: one zip per function, written by scripts/package_functions.
resource "google_storage_bucket" "sources" {
  name     = "${local.bucket_name}-sources"
  location = var.region

  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true

  versioning {
    enabled = true
  }

  # Old source zips are only useful for a rollback shortly after a deploy.
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 7
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
  #checkov:skip=CKV_GCP_62:Holds only build inputs written by terraform; access is in the Cloud Storage audit logs.
}

# The zip's content hash is in the object name, so a changed package is a new object and
# redeploys its function, and an unchanged one deploys nothing (the zips are reproducible).
resource "google_storage_bucket_object" "source" {
  for_each = local.functions
  bucket   = google_storage_bucket.sources.name
  name     = "functions/${each.key}-${filemd5("${local.dist_dir}/${each.key}.zip")}.zip"
  source   = "${local.dist_dir}/${each.key}.zip"
}
