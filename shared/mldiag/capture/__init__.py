"""Capturing profiles: remote traces, continuous-profiling snapshots, degradation alerts."""
