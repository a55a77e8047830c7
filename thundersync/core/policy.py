"""Policy: per-token log-probs of a multi-turn trajectory's action tokens from any causal LM."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import NamedTuple

import torch

from thundersync.protocol.types import Trajectory


class ActionLogprobs(NamedTuple):
    """One entry per action token, in order: log π(a_t | s_t) (gradients flow into the
    model's parameters), the turn of the token, and the policy's exact entropy at that
    position, −Σ_v π(v | s_t) log π(v | s_t) over the whole vocabulary (detached: a metric)."""

    logp_T: torch.Tensor
    turn_T: torch.Tensor
    entropy_T: torch.Tensor


class Policy:
    """Wraps a Hugging Face causal LM (anything returning ``.logits`` for ``input_ids``).

    ``action_logprobs`` runs one forward pass over the whole context
    ``prompt + a_0 + o_0 + ... + a_k`` and returns log π(a_t | s_t) for the action tokens
    only: observation tokens are context, never trained on, and where the model takes
    ``logits_to_keep`` only the positions that predict an action are projected onto the
    vocabulary (``_action_logits``; docs/design.md §3). The model is put in eval mode (dropout
    off), because a gradient must depend only on the parameters and the data.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.model.eval()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._cache_kw = _cache_keyword(model)
        params = inspect.signature(model.forward).parameters.values()
        takes = any(p.name == "logits_to_keep" or p.kind is p.VAR_KEYWORD for p in params)
        self._keeps_logits: bool | None = None if takes else False
        """Whether the model takes a mask of the positions whose logits to compute
        (``_action_logits``): None until its first answer says (a wrapper that passes on
        ``**kwargs``, as PEFT's does, may)."""

    @property
    def vocab_size(self) -> int | None:
        """How many token ids the model takes: the rows of its input embedding, or its output
        size where that is smaller (Hugging Face's ``get_input_embeddings`` and
        ``get_output_embeddings``); None when it exposes neither, and then only negative ids
        are refused."""
        sizes = []
        get_input = getattr(self.model, "get_input_embeddings", None)
        embedding = get_input() if callable(get_input) else None
        if isinstance(embedding, torch.nn.Embedding):
            sizes.append(embedding.num_embeddings)
        get_output = getattr(self.model, "get_output_embeddings", None)
        head = get_output() if callable(get_output) else None
        if isinstance(head, torch.nn.Linear):
            sizes.append(head.out_features)
        return min(sizes) if sizes else None

    @property
    def max_context_tokens(self) -> int | None:
        """The longest context the model takes: its config's ``max_position_embeddings``
        (``n_positions`` for GPT-2); None when the config names neither."""
        config = getattr(self.model, "config", None)
        for name in ("max_position_embeddings", "n_positions"):
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    @property
    def dtype(self) -> torch.dtype:
        return self.params[0].dtype

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def action_logprobs(
        self, trajectory: Trajectory, upto_turn: int | None = None
    ) -> ActionLogprobs:
        """Log-probs (and entropies) of the action tokens of turns ``0..upto_turn`` (all
        when None)."""
        if not trajectory.prompt_ids:
            raise ValueError(
                f"episode {trajectory.episode_id}: empty prompt_ids; the first action token "
                "needs at least one context token before it"
            )
        return self._logprobs([trajectory.context_ids(upto_turn)], padded=False)[0]

    def batch_action_logprobs(self, trajectories: Sequence[Trajectory]) -> list[ActionLogprobs]:
        """``action_logprobs`` for several trajectories in one right-padded forward pass.

        Right padding keeps every real token's position and causal context unchanged, so the
        values agree with the one-by-one pass up to the matmul kernels' rounding.
        """
        return self._logprobs([t.context_ids() for t in trajectories], padded=True)

    def _logprobs(
        self, contexts: list[tuple[list[int], list[int]]], *, padded: bool
    ) -> list[ActionLogprobs]:
        """One forward over the contexts (token ids, each token's turn or −1) as right-padded
        rows (``padded``: with the attention mask that hides the padding; one row alone needs
        none), then each row's action tokens' log-probs and entropies."""
        length = max(len(ids) for ids, _ in contexts)
        ids_BL = torch.zeros((len(contexts), length), dtype=torch.long, device=self.device)
        mask_BL = torch.zeros_like(ids_BL)
        keep_BL = torch.zeros_like(ids_BL, dtype=torch.bool)
        rows = []
        for b, (ids, turn_of) in enumerate(contexts):
            ids_BL[b, : len(ids)] = torch.tensor(ids)
            mask_BL[b, : len(ids)] = 1
            turn_L = torch.tensor(turn_of, device=self.device)
            positions = torch.nonzero(turn_L[1:] >= 0).squeeze(-1)
            keep_BL[b, positions] = True
            rows.append((positions, turn_L[positions + 1]))
        inputs = {"input_ids": ids_BL, **({"attention_mask": mask_BL} if padded else {})}
        logits_NV = self._action_logits(inputs, keep_BL)
        out = []
        for (positions, turn_T), (b, logits_TV) in zip(
            rows, enumerate(logits_NV.split([len(p) for p, _ in rows]))
        ):
            logp_TV = torch.log_softmax(logits_TV, dim=-1)
            logp_T = logp_TV.gather(-1, ids_BL[b, positions + 1][:, None]).squeeze(-1)
            out.append(ActionLogprobs(logp_T, turn_T, _entropy(logp_TV)))
        return out

    def _action_logits(self, inputs: dict, keep_BL: torch.Tensor) -> torch.Tensor:
        """The logits of the positions ``keep_BL`` marks (those that predict an action token),
        row by row: (marked positions, vocabulary). Where the model takes
        ``logits_to_keep`` (Hugging Face's, a boolean mask per row) it projects only those
        positions onto the vocabulary, the rest being context: on an agentic trajectory,
        whose observations outnumber its actions, most of the head's work and of a batch's
        logits memory (rows × length × vocabulary, 78 GB in float32 for eight 16k-token rows
        of a 152k vocabulary). A model that does not, or answers in another shape, gives every
        position's logits, and the marked ones are taken: found out at the first call, from
        its own inputs (no KV cache is involved here; ``_takes_keep_mask`` for the teacher's)."""
        if self._keeps_logits is not False:
            try:
                logits = self.model(**inputs, logits_to_keep=keep_BL).logits
            except (TypeError, ValueError, IndexError, RuntimeError):
                if self._keeps_logits:  # it took one before: a real error
                    raise
                logits = None  # e.g. an int-only ``logits_to_keep``
            if logits is not None and logits.shape == (int(keep_BL.sum()), logits.shape[-1]):
                self._keeps_logits = True
                return logits
            self._keeps_logits = False
        return self.model(**inputs).logits[keep_BL]

    def _takes_keep_mask(self) -> bool:
        """Whether the model takes ``logits_to_keep`` as a boolean mask per row, for the
        teacher's KV-cached forward: where no forward has said yet, a forward of two tokens
        asks, so no episode's cache ever holds a call the model refused (a model whose forward
        names it may take only a count of last positions, and a wrapper that passes on
        ``**kwargs``, as PEFT's does, may take it or not)."""
        if self._keeps_logits is None:
            ids_BL = torch.zeros((1, 2), dtype=torch.long, device=self.device)
            keep_BL = torch.tensor([[False, True]], device=self.device)
            try:
                with torch.no_grad():
                    logits = self.model(input_ids=ids_BL, logits_to_keep=keep_BL).logits
                self._keeps_logits = tuple(logits.shape[:-1]) == (1,)
            except (TypeError, ValueError, IndexError, RuntimeError):
                self._keeps_logits = False  # e.g. an int-only ``logits_to_keep``
        return self._keeps_logits

    @torch.no_grad()
    def score_turn(self, trajectory: Trajectory, turn: int, cache: dict | None = None) -> tuple:
        """Teacher scoring of one turn's action tokens, reusing a KV cache across turns.

        ``cache`` is a dict this method fills (``past_key_values`` and the number of tokens
        it covers); pass the same dict for turns 0, 1, 2, ... of one episode so that each
        call only runs the new tokens. Returns the turn's log-probs as a tuple of floats.
        """
        ids, turn_of = trajectory.context_ids(turn)
        state = cache if cache is not None else {}
        done = state.get("num_tokens", 0)
        # This call runs positions done.. of the context, each predicting the next token: its
        # logits are needed where that token is one of this turn's actions, and at the last
        # position, which predicts the next call's first token (an observation's, or an
        # action's if the observation is empty). Observations are mostly what is new.
        keep = [turn_of[pos + 1] == turn for pos in range(done, len(ids) - 1)] + [True]
        inputs = {
            "input_ids": torch.tensor([ids[done:]], device=self.device),
            self._cache_kw: state.get("past_key_values"),
            "use_cache": True,
        }
        keep_BL = torch.tensor([keep], device=self.device)
        if self._takes_keep_mask():
            out = self.model(**inputs, logits_to_keep=keep_BL)
            logits_KV = out.logits
        else:
            out = self.model(**inputs)
            logits_KV = out.logits[keep_BL]
        logp_KV = torch.log_softmax(logits_KV, dim=-1)
        # The predictors' rows: the previous call's last position (kept from then), then this
        # call's kept positions in order.
        predictors = [done - 1] if done else []
        predictors += [done + j for j, kept in enumerate(keep) if kept]
        if done:
            logp_KV = torch.cat([state["last_logp_V"][None], logp_KV])
        past = out["cache"] if "cache" in out else out["past_key_values"]
        state.update(past_key_values=past, num_tokens=len(ids), last_logp_V=logp_KV[-1])
        row_of = {pos: row for row, pos in enumerate(predictors)}
        positions = [pos for pos in range(max(done, 1), len(ids)) if turn_of[pos] == turn]
        rows = torch.tensor([row_of[pos - 1] for pos in positions], device=self.device)
        tokens = torch.tensor([ids[pos] for pos in positions], dtype=torch.long, device=self.device)
        return tuple(logp_KV[rows, tokens].tolist())  # one copy off a GPU, not one per token


@torch.no_grad()
def _entropy(logp_TV: torch.Tensor) -> torch.Tensor:
    """−Σ_v p log p per row, in float64; a token of probability 0 adds 0 (not 0 · −inf)."""
    logp_TV = logp_TV.detach().to(torch.float64)
    p_TV = logp_TV.exp()
    return -torch.where(p_TV > 0, p_TV * logp_TV, 0.0).sum(-1)


def _cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` since transformers 5.x renamed it (the
    old ``past_key_values`` then warns FutureWarning on every call), else
    ``past_key_values``."""
    import inspect

    forward = getattr(model, "forward", None)
    try:
        names = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        names = {}
    return "cache" if "cache" in names else "past_key_values"
