"""Rollout engines behind one protocol (``protocol.Engine``): HF transformers, vLLM (planned)."""
