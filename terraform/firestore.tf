# Firestore (native mode): runs, targets, sessions, claims, share links, role bindings.
resource "google_firestore_database" "main" {
  project     = var.project
  name        = var.firestore_database
  location_id = local.firestore_loc
  type        = "FIRESTORE_NATIVE"

  concurrency_mode                  = "OPTIMISTIC"
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  delete_protection_state           = "DELETE_PROTECTION_ENABLED"
  # `terraform destroy` leaves the data: delete the database by hand once it is not needed.
  deletion_policy = "ABANDON"

  depends_on = [google_project_service.apis]
}

# The indexes of the state store's queries: mldiag.adapters.gcp.state.INDEXES, the adapter's
# own list in firestore.indexes.json form, is the source; tests/deploy/test_terraform.py checks
# that this file says the same. `list_sessions` filters sessions on run and/or state and orders
# them by run and session; the console's lists (`query_sessions`, `query_runs`) filter on one
# field or more (each with its own index per sort order, which Firestore merges) and order by
# creation time or name. An order of "CONTAINS" is an array-contains index (the name search).
locals {
  firestore_indexes = {
    sessions_by_run_session                    = { collection = "sessions", fields = [{ path = "run", order = "ASCENDING" }, { path = "session", order = "ASCENDING" }] }
    sessions_by_state_run_session              = { collection = "sessions", fields = [{ path = "state", order = "ASCENDING" }, { path = "run", order = "ASCENDING" }, { path = "session", order = "ASCENDING" }] }
    sessions_by_run_state_session              = { collection = "sessions", fields = [{ path = "run", order = "ASCENDING" }, { path = "state", order = "ASCENDING" }, { path = "session", order = "ASCENDING" }] }
    sessions_by_run_created_at_desc            = { collection = "sessions", fields = [{ path = "run", order = "ASCENDING" }, { path = "created_at", order = "DESCENDING" }] }
    sessions_by_run_created_at                 = { collection = "sessions", fields = [{ path = "run", order = "ASCENDING" }, { path = "created_at", order = "ASCENDING" }] }
    sessions_by_state_created_at_desc          = { collection = "sessions", fields = [{ path = "state", order = "ASCENDING" }, { path = "created_at", order = "DESCENDING" }] }
    sessions_by_state_created_at               = { collection = "sessions", fields = [{ path = "state", order = "ASCENDING" }, { path = "created_at", order = "ASCENDING" }] }
    sessions_by_state_session                  = { collection = "sessions", fields = [{ path = "state", order = "ASCENDING" }, { path = "session", order = "ASCENDING" }] }
    sessions_by_verdict_created_at_desc        = { collection = "sessions", fields = [{ path = "verdict", order = "ASCENDING" }, { path = "created_at", order = "DESCENDING" }] }
    sessions_by_verdict_created_at             = { collection = "sessions", fields = [{ path = "verdict", order = "ASCENDING" }, { path = "created_at", order = "ASCENDING" }] }
    sessions_by_verdict_session                = { collection = "sessions", fields = [{ path = "verdict", order = "ASCENDING" }, { path = "session", order = "ASCENDING" }] }
    sessions_by_trigger_created_at_desc        = { collection = "sessions", fields = [{ path = "trigger", order = "ASCENDING" }, { path = "created_at", order = "DESCENDING" }] }
    sessions_by_trigger_created_at             = { collection = "sessions", fields = [{ path = "trigger", order = "ASCENDING" }, { path = "created_at", order = "ASCENDING" }] }
    sessions_by_trigger_session                = { collection = "sessions", fields = [{ path = "trigger", order = "ASCENDING" }, { path = "session", order = "ASCENDING" }] }
    sessions_by_terms_contains_created_at_desc = { collection = "sessions", fields = [{ path = "terms", order = "CONTAINS" }, { path = "created_at", order = "DESCENDING" }] }
    sessions_by_terms_contains_created_at      = { collection = "sessions", fields = [{ path = "terms", order = "CONTAINS" }, { path = "created_at", order = "ASCENDING" }] }
    sessions_by_terms_contains_session         = { collection = "sessions", fields = [{ path = "terms", order = "CONTAINS" }, { path = "session", order = "ASCENDING" }] }
    runs_by_terms_contains_created_at_desc     = { collection = "runs", fields = [{ path = "terms", order = "CONTAINS" }, { path = "created_at", order = "DESCENDING" }] }
    runs_by_terms_contains_created_at          = { collection = "runs", fields = [{ path = "terms", order = "CONTAINS" }, { path = "created_at", order = "ASCENDING" }] }
    runs_by_terms_contains_name                = { collection = "runs", fields = [{ path = "terms", order = "CONTAINS" }, { path = "name", order = "ASCENDING" }] }
  }
  firestore_index_scope = "COLLECTION"

  # Large JSON fields that no query reads: kept out of the automatic single-field indexes.
  firestore_unindexed_fields = {
    runs_data            = { collection = "runs", field = "data" }
    targets_data         = { collection = "targets", field = "data" }
    sessions_data        = { collection = "sessions", field = "data" }
    dead_letters_payload = { collection = "dead_letters", field = "payload" }
    captures_times       = { collection = "captures", field = "times" }
    captures_keys        = { collection = "captures", field = "keys" }
    metrics_points       = { collection = "metrics", field = "points" }
    requests_data        = { collection = "requests", field = "data" }
  }
}

resource "google_firestore_index" "index" {
  for_each    = local.firestore_indexes
  project     = var.project
  database    = google_firestore_database.main.name
  collection  = each.value.collection
  query_scope = local.firestore_index_scope

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path   = fields.value.path
      order        = fields.value.order == "CONTAINS" ? null : fields.value.order
      array_config = fields.value.order == "CONTAINS" ? "CONTAINS" : null
    }
  }
}

# The console's share-link access log, newest first per link (list_access(link_id=...)):
# mldiag.adapters.gcp.access.INDEXES.
resource "google_firestore_index" "share_access" {
  project     = var.project
  database    = google_firestore_database.main.name
  collection  = "share_access"
  query_scope = "COLLECTION"

  fields {
    field_path = "link_id"
    order      = "ASCENDING"
  }
  fields {
    field_path = "at"
    order      = "DESCENDING"
  }
}

resource "google_firestore_field" "unindexed" {
  for_each   = local.firestore_unindexed_fields
  project    = var.project
  database   = google_firestore_database.main.name
  collection = each.value.collection
  field      = each.value.field

  # An empty index_config turns off the field's single-field indexes.
  index_config {}
}

# Claims, dead letters, failure counters and pull targets' mailboxes carry a `purge_at` timestamp (mldiag.adapters.gcp.state.TTL_FIELDS):
# Firestore deletes them after it, so these collections do not grow for ever.
resource "google_firestore_field" "ttl" {
  for_each   = toset(["claims", "dead_letters", "failures", "requests"])
  project    = var.project
  database   = google_firestore_database.main.name
  collection = each.value
  field      = "purge_at"

  ttl_config {}
  index_config {}
}
