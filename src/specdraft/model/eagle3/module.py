"""The EAGLE-3 drafter: fc over n aux hidden states (3 by default), one Llama decoder layer whose attention
takes [embed(token); hidden] (2H wide), a final norm, and an lm_head over the draft vocab.

    aux [B,T,nH] --fc--> h [B,T,H]        (fc_norm: each H-wide aux chunk RMS-normed first)
    x = cat(input_layernorm(embed(tok)), hidden_norm(h))          [B,T,2H]
    h = residual + attn(x)        residual = h (or hidden_norm(h) with norm_before_residual)
    h = h + mlp(post_attention_layernorm(h))                      decode() -> out (pre-norm) [B,T,H]
    logits = lm_head(norm(out))                                   compute_logits() [B,T,draft_vocab]
    next step's hidden = out (or norm(out) with norm_output)      feedback()

Attention keeps its keys/values in a cache that simply grows (transformers' `DynamicCache` in
training, model/common/cache.py's GrowingKVCache in generation, both through `update`): training-time
test (TTT) appends one block of T keys per unrolled step and passes an explicit boolean mask (see
`ttt_mask`), and speculative generation appends the accepted/drafted tokens and crops on rejection.
One code path.
A flex-attention BlockMask (`ttt_block_mask`, same semantics) instead of a boolean mask selects
flex_attention: compiled on CUDA, eager (a slow reference that materialises the scores) elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from specdraft.model.common.cache import DynamicCache
from specdraft.model.common.heads import init_heads_from_target
from specdraft.model.eagle3.config import DrafterConfig


_compiled_flex = None


def flex_attention_for(device: torch.device):
    """flex_attention compiled once on CUDA (its fused kernel); eager elsewhere (tests only)."""
    global _compiled_flex
    if device.type != "cuda":
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


class DrafterAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)

    def forward(self, x, cos, sin, mask, cache: DynamicCache):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)    # [B,nh,T,hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)   # [B,nkv,T,hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k_all, v_all = cache.update(k, v, 0)                                 # [B,nkv,S+T,hd]
        if isinstance(mask, BlockMask):
            out = flex_attention_for(q.device)(q, k_all, v_all, block_mask=mask, enable_gqa=True)
        elif isinstance(mask, TTTBlocks):
            out = mask.attend(q, k_all, v_all)
        else:
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask,   # mask [B|1,1,T,S+T] bool
                                                 enable_gqa=True)               # no repeat_kv copies
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class DrafterLayer(nn.Module):
    """Names match speculators/vLLM (`layers.0.*`): input_layernorm, hidden_norm, self_attn, mlp."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H = cfg.hidden_size
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = DrafterAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, embeds, hidden, cos, sin, mask, cache):
        normed_hidden = self.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)  # [B,T,2H]
        h = residual + self.self_attn(x, cos, sin, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H = cfg.hidden_size
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        n_aux = cfg.num_aux
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        # EAGLE-3.1's fc_norm: the aux layers' scales differ by 10x and more; a norm per chunk evens them
        self.fc_norm = (nn.ModuleList([LlamaRMSNorm(H, cfg.rms_norm_eps) for _ in range(n_aux)])
                        if cfg.fc_norm else None)
        self.layers = nn.ModuleList([DrafterLayer(cfg)])
        self.norm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(cfg.llama_config())
        # target_id = draft_id + d2t[draft_id]; t2d[target_id] is True for the draft vocab
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        if cfg.tie_embeddings_to_target:
            self.embed_tokens.weight.requires_grad_(False)

    def combine_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B,T,n,H] or [B,T,nH] -> (fc_norm per chunk) -> fc -> [B,T,H]."""
        if self.fc_norm is not None:
            chunks = aux.unbind(-2) if aux.dim() == 4 else aux.chunk(len(self.fc_norm), dim=-1)
            return self.fc(torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1))
        return self.fc(aux.flatten(-2) if aux.dim() == 4 else aux)

    def decode(self, input_ids, hidden, position_ids, mask, cache: DynamicCache) -> torch.Tensor:
        """The decoder layer: tokens [B,T] + hidden [B,T,H] -> its output [B,T,H], before the final norm.
        `hidden` is fc(aux) at draft step 0 and `feedback()` of the step before afterwards."""
        embeds = self.embed_tokens(input_ids)                                    # [B,T,H]
        cos, sin = self.rotary_emb(hidden, position_ids)
        return self.layers[0](embeds.to(hidden.dtype), hidden, cos, sin, mask, cache)

    def compute_logits(self, out: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """decode()'s output [B,T,H] -> logits over the draft vocab [B,T,Vd] (final norm, lm_head).
        With `rows` (flat positions [R]) -> [R,Vd] there only: training runs the wide lm_head only
        where a prediction has a teacher (the norm still sees all of `out`: same bits as before)."""
        normed = self.norm(out)                                                  # [B,T,H]
        return self.lm_head(normed if rows is None else normed.flatten(0, 1)[rows])

    def feedback(self, out: torch.Tensor) -> torch.Tensor:
        """What the next draft step takes as `hidden`: decode()'s output as it is (what vLLM feeds
        back), or after the final norm with config.norm_output."""
        return self.norm(out) if self.config.norm_output else out

    def forward(self, input_ids, hidden, position_ids, mask, cache: DynamicCache):
        """One draft step -> (logits [B,T,Vd], the next step's hidden [B,T,H])."""
        out = self.decode(input_ids, hidden, position_ids, mask, cache)
        return self.compute_logits(out), self.feedback(out)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def init_from_target(self, target_model, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        init_heads_from_target(self, target_model, d2t, t2d)

    @torch.no_grad()
    def init_layer_from_target(self, last_layer: dict[str, torch.Tensor]) -> None:
        """Start the decoder layer from the target's last one (`targets.last_layer_tensors`): q/k/v
        read the hidden-state half of [embeds; hidden] (zeros on the embedding half, so at step 0
        the layer computes what the target's last layer computes on fc's output); o_proj, MLP and
        norms copied (the target's input_layernorm becomes hidden_norm)."""
        mine, H = self.layers[0], self.config.hidden_size
        for name in ("q_proj", "k_proj", "v_proj"):
            weight = getattr(mine.self_attn, name).weight                        # [out, 2H]
            weight.zero_()
            weight[:, H:] = last_layer[f"self_attn.{name}.weight"].float()
        mine.self_attn.o_proj.weight.copy_(last_layer["self_attn.o_proj.weight"].float())
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mine.mlp, name).weight.copy_(last_layer[f"mlp.{name}.weight"].float())
        mine.hidden_norm.weight.copy_(last_layer["input_layernorm.weight"].float())
        mine.post_attention_layernorm.weight.copy_(last_layer["post_attention_layernorm.weight"].float())


def causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """[B,T] document ids (-1 = padding) -> bool [B,1,T,T]: query i sees key j <= i of its own document."""
    return prefix_mask(doc_ids, 0, 0, 0, doc_ids.shape[1], 0, doc_ids.shape[1])


def prefix_mask(doc_ids: torch.Tensor, step: int, window: int, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
    """The step-0 part of TTT step `step`'s mask for queries q0..q1-1 over keys k0..k1-1 -> bool
    [B,1,q1-q0,k1-k0]: key j <= i of query i's own document and, with window > 0, less than `window`
    positions back from the query's position i + step; a query always sees its own key (padding
    included: no empty row)."""
    dev = doc_ids.device
    qi, kj = torch.arange(q0, q1, device=dev), torch.arange(k0, k1, device=dev)
    own = qi[:, None] == kj[None, :]                                                  # [q,k]
    seen = doc_ids[:, q0:q1, None] == doc_ids[:, None, k0:k1]                         # [B,q,k] same document
    seen &= kj[None, :] <= qi[:, None]
    if window > 0:
        seen &= (qi[:, None] + step - kj[None, :]) < window
    return (seen | own)[:, None]


def ttt_mask(doc_ids: torch.Tensor, step: int, window: int = 0) -> torch.Tensor:
    """Mask for TTT step `step` over the keys of steps 0..step, [B,1,T,(step+1)*T].

    Query i sees the causal prefix of step 0 (keys j <= i, same document) plus key i of every
    step 1..step (one diagonal per step, its own included). window > 0 (sliding-window attention):
    the query, at position i + step, sees only prefix keys less than `window` positions back
    (i + step - j < window), as a serving engine's sliding window does.
    """
    return block_mask(doc_ids, step, window, 0, doc_ids.shape[1], 0)


def block_mask(doc_ids: torch.Tensor, step: int, window: int, q0: int, q1: int, k0: int) -> torch.Tensor:
    """ttt_mask's rows q0..q1-1 over the step-0 keys k0..q1-1 and their own diagonals of steps 1..step."""
    eye = torch.eye(q1 - q0, dtype=torch.bool, device=doc_ids.device).expand(doc_ids.shape[0], 1, -1, -1)
    return torch.cat([prefix_mask(doc_ids, step, window, q0, q1, k0, q1)] + [eye] * step, dim=-1)


@dataclass
class TTTBlocks:
    """`ttt_mask(doc_ids, step, window)` applied by blocks of `block` queries: each block attends only
    to the keys some query of it can see (from its first query's document start, or its window, up to
    its last query; and its own diagonals of steps 1..step), so a long row's attention costs about half
    of T x T per step (T x window with a window) and no T x (step+1)T mask exists. Same result as the
    dense mask up to summation order. Packed documents are contiguous (train/batches.py)."""
    doc_ids: torch.Tensor        # [B,T], -1 on padding
    step: int
    window: int = 0
    block: int = 1024

    def doc_starts(self) -> torch.Tensor:
        """[B,T]: the position where each position's document starts."""
        B, T = self.doc_ids.shape
        pos = torch.arange(T, device=self.doc_ids.device).expand(B, T)
        new = torch.ones_like(self.doc_ids, dtype=torch.bool)
        new[:, 1:] = self.doc_ids[:, 1:] != self.doc_ids[:, :-1]
        return torch.where(new, pos, 0).cummax(dim=1).values

    def attend(self, q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor) -> torch.Tensor:
        """q [B,nh,T,hd], keys/values of steps 0..step [B,nkv,(step+1)T,hd] -> [B,nh,T,hd]."""
        T, starts, outs = q.shape[2], self.doc_starts(), []
        for q0 in range(0, T, self.block):
            q1 = min(T, q0 + self.block)
            k0 = int(starts[:, q0].min())
            if self.window > 0:                                   # (its own key q0 always: the mask's eye)
                k0 = max(k0, min(q0, q0 + self.step - self.window + 1))
            keys = [slice(k0, q1)] + [slice(s * T + q0, s * T + q1) for s in range(1, self.step + 1)]
            mask = block_mask(self.doc_ids, self.step, self.window, q0, q1, k0)
            outs.append(F.scaled_dot_product_attention(
                q[:, :, q0:q1], torch.cat([k_all[:, :, s] for s in keys], dim=2),
                torch.cat([v_all[:, :, s] for s in keys], dim=2), attn_mask=mask, enable_gqa=True))
        return torch.cat(outs, dim=2)


def ttt_block_mask(doc_ids: torch.Tensor, step: int, window: int = 0) -> BlockMask:
    """`ttt_mask(doc_ids, step, window)` as a flex-attention BlockMask over KV_LEN = (step+1)*T keys."""
    B, T = doc_ids.shape
    reach = window if window > 0 else T + step + 1               # full attention: every earlier key is near

    def mask_mod(b, h, q_idx, kv_idx):
        block, j = kv_idx // T, kv_idx % T                       # TTT step of the key, its position
        prefix = ((block == 0) & (j <= q_idx) & (doc_ids[b, j] == doc_ids[b, q_idx])
                  & (q_idx + step - j < reach))
        return prefix | (j == q_idx)                             # one diagonal per step (and padding sees itself)

    return create_block_mask(mask_mod, B, None, T, (step + 1) * T, device=doc_ids.device)
