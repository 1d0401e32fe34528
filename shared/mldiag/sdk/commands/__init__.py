"""Upstream's commands, run as `python -m mldiag.sdk.commands.NAME`: `run_vllm` (vLLM with a
run around it) and `collect_profile` (a remote trace of profiler servers into a logdir)."""
