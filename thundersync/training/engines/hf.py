"""``HFEngine``: batched sampling with a transformers causal LM (CPU or GPU), the embedded default.

One padded prefill, then one decode step per token with the KV cache, for every request of a
batch at once. Each request draws from its own ``torch.Generator`` seeded with its
``GenerationRequest.seed``, so a token depends on the request's seed and its logits only. With
``batch_invariant=True`` every request also runs alone (no padding, no other rows in the
matmuls), which makes its logits — hence its tokens — bitwise independent of batch
composition and timing: what ``--deterministic`` training needs. Batched, logits can differ
in the last bits between batch shapes, which flips a sampled token only when the uniform draw
lands within rounding of a boundary.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from thundersync.training.engines.engine import Completion, GenerationRequest, generate_checked


class HFEngine:
    """Matches ``thundersync.training.engines.engine.Engine``."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        batch_invariant: bool = False,
        policy_version: int = 0,
    ) -> None:
        from thundersync.lora import load_policy, synced_parameters

        self.model = load_policy(model_dir, dtype=dtype).to(device)
        self.model.requires_grad_(False)
        # what the learner publishes: with LoRA the adapter only, the base weights stay put
        self.params = synced_parameters(self.model)
        self.device = torch.device(device)
        self.batch_invariant = batch_invariant
        self.policy_version = policy_version
        config = self.model.config
        self.max_context = int(
            getattr(config, "max_position_embeddings", None) or config.n_positions
        )
        pad = getattr(config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        base = getattr(self.model, "get_base_model", lambda: self.model)()  # under an adapter
        forward = inspect.signature(base.forward).parameters
        # transformers renamed past_key_values to cache (5.x); accept either.
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"
        # The prefill needs only each row's last logits: a model that takes ``logits_to_keep``
        # projects one position per row onto the vocabulary instead of the whole prompt
        # (32 prompts of 1000 tokens and a 152k vocabulary: 19 GB of float32 logits).
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}

    # --- weights -----------------------------------------------------------------------------

    def load_weights(self, flat: torch.Tensor, policy_version: int) -> None:
        numel = sum(p.numel() for p in self.params)
        if flat.numel() != numel:
            raise ValueError(f"load_weights: got {flat.numel()} values for {numel} parameters")
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n
        self.policy_version = policy_version

    def close(self) -> None:
        self.model = None

    # --- generation --------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return generate_checked(
            requests,
            self._generate,
            max_context=self.max_context,
            batch_invariant=self.batch_invariant,
        )

    @torch.no_grad()
    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        batch = len(requests)
        length = max(len(r.prompt_ids) for r in requests)
        ids_BL = torch.full((batch, length), self.pad_id, dtype=torch.long)
        mask_BL = torch.zeros((batch, length), dtype=torch.long)
        for b, request in enumerate(requests):
            ids_BL[b, length - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask_BL[b, length - len(request.prompt_ids) :] = 1
        ids_BL, mask_BL = ids_BL.to(self.device), mask_BL.to(self.device)
        generators = [torch.Generator().manual_seed(r.seed) for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        reasons = ["length"] * batch
        live = [True] * batch
        position_BL = (mask_BL.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids_BL,
            attention_mask=mask_BL,
            position_ids=position_BL,
            use_cache=True,
            **self._last_only,
        )
        positions_B = position_BL[:, -1]
        while True:
            next_B = self._sample(out.logits[:, -1], requests, generators, live, tokens, logprobs)
            for b, request in enumerate(requests):
                if live[b] and tokens[b][-1] in request.params.stop_ids:
                    live[b], reasons[b] = False, "stop"
                elif live[b] and len(tokens[b]) >= request.params.max_new_tokens:
                    live[b] = False
            if not any(live):
                break
            ones_B1 = torch.ones((batch, 1), dtype=mask_BL.dtype, device=self.device)
            mask_BL = torch.cat([mask_BL, ones_B1], dim=1)
            # Only live rows advance: a finished row's padding must not walk its position past
            # the model's window (GPT-2's position table ends there).
            positions_B = positions_B + torch.tensor(
                live, dtype=positions_B.dtype, device=self.device
            )
            out = self.model(
                input_ids=next_B[:, None],
                attention_mask=mask_BL,
                position_ids=positions_B[:, None],
                use_cache=True,
                **{self._cache_kw: _cache_of(out)},
            )
        return [
            Completion(tuple(t), tuple(lp), reason, self.policy_version)
            for t, lp, reason in zip(tokens, logprobs, reasons)
        ]

    def _sample(
        self,
        logits_BV: torch.Tensor,
        requests: list[GenerationRequest],
        generators: list[torch.Generator],
        live: list[bool],
        tokens: list[list[int]],
        logprobs: list[list[float]],
    ) -> torch.Tensor:
        """One token for every live request, drawn with its own generator (pad elsewhere).

        A draw is ``torch.multinomial(p, 1, generator=g)``'s, done for the live rows at once:
        an exponential variate per vocabulary entry from the request's generator, the token the
        argmax of p / q. The variates come row by row (each from its own generator), the rest in
        one call for the batch, so a token is bitwise the one ``multinomial`` draws and the
        generator is left in the same state, at one call per row instead of five
        (tests/unit/thundersync/training/test_engine.py checks it against ``multinomial``)."""
        next_B = torch.full((len(requests),), self.pad_id, dtype=torch.long)
        rows = [b for b, alive in enumerate(live) if alive]
        logits_RV = logits_BV[rows].float().cpu()
        logp_RV = torch.empty_like(logits_RV)
        temperatures = [requests[b].params.temperature for b in rows]
        for temperature in set(temperatures):  # a scalar divides as it did row by row
            same = torch.tensor([t == temperature for t in temperatures])
            scaled = logits_RV[same] / temperature if temperature > 0 else logits_RV[same]
            logp_RV[same] = torch.log_softmax(scaled, dim=-1)
        token_R = torch.empty(len(rows), dtype=torch.long)
        greedy = [r for r, t in enumerate(temperatures) if not t > 0]
        if greedy:
            token_R[greedy] = logp_RV[greedy].argmax(-1)
        sampled = [r for r, t in enumerate(temperatures) if t > 0]
        if sampled:
            p_SV = logp_RV[sampled].exp()
            if torch.isnan(p_SV).any():
                raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
            q_SV = torch.empty_like(p_SV)
            for s, r in enumerate(sampled):
                q_SV[s].exponential_(1, generator=generators[rows[r]])
            token_R[sampled] = (p_SV / q_SV).argmax(-1)
        logp_R = logp_RV.gather(1, token_R[:, None])[:, 0]
        for b, token, logp in zip(rows, token_R.tolist(), logp_R.tolist()):
            tokens[b].append(token)
            logprobs[b].append(logp)
        next_B[rows] = token_R
        return next_B.to(self.device)


def _cache_of(output: Any) -> Any:
    return output["cache"] if "cache" in output else output["past_key_values"]
