"""Tests of the Gemini investigator against a local fake Vertex AI endpoint."""
