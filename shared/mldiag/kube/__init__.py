"""Kubernetes (GKE) support: pods of labelled JobSet/Job workloads become push targets by
themselves (`discover`), and labelled pods get the SDK's settings injected (`webhook`).

`pods` is the typed view of a pod object and the naming rules both share; it needs no
Kubernetes client. `discover` needs the `kubernetes` package (`pip install mldiag[kube]`).
"""
