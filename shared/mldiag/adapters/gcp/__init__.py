"""Google Cloud adapters (GCS, Firestore, Pub/Sub, Gemini on Vertex AI).

Each module imports its cloud SDK lazily, so `import mldiag` never needs the `gcp` extra.
"""
