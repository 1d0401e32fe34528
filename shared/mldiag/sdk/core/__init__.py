"""`google_cloud_mldiagnostics.core`'s layout: `core.xprof`."""

from mldiag.sdk.core import xprof

__all__ = ["xprof"]
