"""Adapters that plug nvrtc_gather's ops into serving engines: ``integrations.vllm`` and
``integrations.sglang``. Neither engine is imported unless it is already present."""
