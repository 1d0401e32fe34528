"""FirestoreAccessStore: tokens, role bindings, share links and their access log in Firestore.

The semantics are SqliteAccessStore's. Revocations and consuming a login code are
transactions (read the record, check it, write `revoked_at`), so of several racing uses of
one code exactly one wins; adding a binding is a conditional create.

Layout (each document holds its record's fields as they are):

- `tokens/{token_hash}`: TokenRecords, looked up by hash, revoked by their `id` field;
- `grants/{sha256 of [principal, role, run]}`: Grants (a hash, since any of the three may
  hold characters a document id cannot);
- `share_links/{token_hash}`: ShareLinks, revoked by their `id` field;
- `share_access/{AccessEntry.key}`: AccessEntries, one per link, principal, client network
  and hour, counting its uses (`list_access` of one link, and keeping a link's newest rows,
  need the index of INDEXES); those of before aggregation have an auto id, one use each.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import firestore

from mldiag.access import (
    ACCESS_ROWS_PER_LINK,
    ALL_RUNS,
    AccessEntry,
    Grant,
    ShareLink,
    TokenRecord,
)
from mldiag.adapters.gcp.firestore_client import LazyFirestore, read
from mldiag.adapters.gcp.state import doc_id
from mldiag.adapters.gcp.transactions import DocumentTransactions

T = TypeVar("T")

TOKENS, GRANTS, SHARE_LINKS, SHARE_ACCESS = "tokens", "grants", "share_links", "share_access"

# The composite index of list_access(link_id=...), in `firestore.indexes.json` form.
INDEXES: dict[str, list[dict[str, Any]]] = {
    "indexes": [
        {"collectionGroup": SHARE_ACCESS, "queryScope": "COLLECTION",
         "fields": [{"fieldPath": "link_id", "order": "ASCENDING"},
                    {"fieldPath": "at", "order": "DESCENDING"}]},
    ],
    "fieldOverrides": [],
}


def grant_id(principal: str, role: str, run: str) -> str:
    """The document id of the binding (principal, role, run), one per triple."""
    return hashlib.sha256(json.dumps([principal, role, run]).encode()).hexdigest()


class FirestoreAccessStore(LazyFirestore):
    """The access port on a Firestore database (Native mode). Safe to share between threads.

    `client` is a `google.cloud.firestore.Client` (built from `project` and `database` when
    omitted, which uses the ambient credentials).
    """

    def __init__(self, *, client: firestore.Client | None = None, project: str | None = None,
                 database: str = "(default)", max_attempts: int = 20,
                 max_access_rows: int = ACCESS_ROWS_PER_LINK) -> None:
        super().__init__(client=client, project=project, database=database)
        self.max_attempts = max_attempts
        self.max_access_rows = max_access_rows
        self._transactions = DocumentTransactions(stripes=16)

    def _tx(self, ref: Any, fn: Callable[[Any], T]) -> T:
        """Run `fn(transaction)`, a read-modify-write of `ref`, in a transaction."""
        return self._transactions.run(self.client, ref, fn, max_attempts=self.max_attempts)

    def _by_id(self, collection: str, record_id: str) -> Any:
        """The reference of the document whose `id` field is `record_id`, or None."""
        docs = (self.client.collection(collection)
                .where(filter=firestore.FieldFilter("id", "==", record_id)).limit(1).get())
        return docs[0].reference if docs else None

    def _revoke(self, collection: str, record_id: str, now: float) -> bool:
        ref = self._by_id(collection, record_id)
        if ref is None:
            return False

        def tx(transaction: Any) -> bool:
            snap = read(ref, transaction)
            if not snap.exists or snap.get("revoked_at"):
                return False
            transaction.update(ref, {"revoked_at": now})
            return True

        return self._tx(ref, tx)

    # Tokens

    def _token_ref(self, token_hash: str) -> Any:
        return self.client.collection(TOKENS).document(doc_id(token_hash))

    def put_token(self, record: TokenRecord) -> None:
        self._token_ref(record.token_hash).set(record.to_dict())

    def find_token(self, token_hash: str) -> TokenRecord | None:
        snap = read(self._token_ref(token_hash))
        return TokenRecord(**(snap.to_dict() or {})) if snap.exists else None

    def list_tokens(self) -> list[TokenRecord]:
        query: Any = self.client.collection(TOKENS).order_by(
            "created_at", direction=firestore.Query.DESCENDING)
        return [TokenRecord(**d.to_dict()) for d in query.stream()]

    def revoke_token(self, token_id: str, now: float) -> bool:
        return self._revoke(TOKENS, token_id, now)

    def consume_token(self, token_hash: str, now: float) -> TokenRecord | None:
        ref = self._token_ref(token_hash)

        def tx(transaction: Any) -> TokenRecord | None:
            snap = read(ref, transaction)
            record = TokenRecord(**(snap.to_dict() or {})) if snap.exists else None
            if record is None or not record.valid(now):
                return None
            transaction.update(ref, {"revoked_at": now})
            record.revoked_at = now
            return record

        return self._tx(ref, tx)

    # Role bindings

    def _grant_ref(self, principal: str, role: str, run: str) -> Any:
        return self.client.collection(GRANTS).document(grant_id(principal, role, run))

    def grant(self, grant: Grant) -> None:
        try:
            # An existing binding is kept as it was (who made it, and when).
            self._grant_ref(grant.principal, grant.role, grant.run).create(grant.to_dict())
        except gexc.AlreadyExists:
            pass

    def revoke_grant(self, principal: str, role: str, run: str = ALL_RUNS) -> bool:
        try:
            self._grant_ref(principal, role, run).delete(
                option=self.client.write_option(exists=True))
        except gexc.NotFound:
            return False
        return True

    def list_grants(self, principal: str | None = None) -> list[Grant]:
        query: Any = self.client.collection(GRANTS)
        if principal is not None:
            query = query.where(filter=firestore.FieldFilter("principal", "==", principal))
        grants = [Grant(**d.to_dict()) for d in query.stream()]
        return sorted(grants, key=lambda g: (g.principal, g.run, g.role))

    # Share links

    def _link_ref(self, token_hash: str) -> Any:
        return self.client.collection(SHARE_LINKS).document(doc_id(token_hash))

    def put_link(self, link: ShareLink) -> None:
        self._link_ref(link.token_hash).set(link.to_dict())

    def find_link(self, token_hash: str) -> ShareLink | None:
        snap = read(self._link_ref(token_hash))
        return ShareLink(**(snap.to_dict() or {})) if snap.exists else None

    def list_links(self, run: str | None = None, session: str | None = None
                   ) -> list[ShareLink]:
        # Equality filters only (no composite index); a session has few links to sort.
        query: Any = self.client.collection(SHARE_LINKS)
        if run is not None:
            query = query.where(filter=firestore.FieldFilter("run", "==", run))
        if session is not None:
            query = query.where(filter=firestore.FieldFilter("session", "==", session))
        links = [ShareLink(**d.to_dict()) for d in query.stream()]
        return sorted(links, key=lambda link: link.created_at, reverse=True)

    def revoke_link(self, link_id: str, now: float) -> bool:
        return self._revoke(SHARE_LINKS, link_id, now)

    # Access log

    def log_access(self, entry: AccessEntry) -> None:
        ref = self.client.collection(SHARE_ACCESS).document(entry.key)

        def tx(transaction: Any) -> bool:
            snap = read(ref, transaction)
            row = AccessEntry(**(snap.to_dict() or {})).merged(entry) if snap.exists else entry
            transaction.set(ref, row.to_dict())
            return not snap.exists

        if self._tx(ref, tx):
            # A new row: the link's oldest beyond the cap go.
            for old in self.access_query(entry.link_id, limit=500).offset(
                    self.max_access_rows).stream():
                old.reference.delete()

    def access_query(self, link_id: str | None = None, limit: int = 1000) -> Any:
        """The query list_access runs (filtered by link, it needs the index of INDEXES)."""
        query: Any = self.client.collection(SHARE_ACCESS)
        if link_id is not None:
            query = query.where(filter=firestore.FieldFilter("link_id", "==", link_id))
        return query.order_by("at", direction=firestore.Query.DESCENDING).limit(limit)

    def list_access(self, link_id: str | None = None, limit: int = 1000) -> list[AccessEntry]:
        return [AccessEntry(**d.to_dict()) for d in self.access_query(link_id, limit).stream()]
