"""mldiag: automatic XProf profile analysis for ML workloads."""

__version__ = "0.1.0"
