"""Rollout engines behind one protocol (``protocol.Engine``): HF transformers and vLLM."""
