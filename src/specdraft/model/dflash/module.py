"""DFlash's config and module: a block drafter over N target layers, as vLLM's DFlashDraftModel
(qwen3_dflash.py) serves it.

    aux [T, n_aux*H] --fc--> hidden_norm --> context [T, H]          one row per target position
    per layer: context K/V = k_norm(k_proj(context)) (roped), v_proj(context)    [nkv, T, hd] each
    block = [anchor token, mask, ..., mask] at positions a..a+K          embed -> x [K+1, H]
    per layer (Qwen3 style, q_norm/k_norm per head):
        x = x + o_proj(attn(q(x), [context K; block K], [context V; block V]))    non-causal in the block
        x = x + mlp(post_attention_layernorm(x))
    logits = lm_head(norm(x))       slot j (1..K) drafts token a+j; the anchor's row is not used

The anchor is the last accepted token, whose own target state is not known yet, so the context ends
at a-1. All K drafts come from one forward, whatever K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from specdraft.model.common.config import BaseConfig
from specdraft.model.common.heads import init_heads_from_target


@dataclass
class DFlashConfig(BaseConfig):
    model_type = "dflash"                 # the family (families.py); a class attribute, not a field
    num_layers: int = 1                   # decoder layers (the draft's num_hidden_layers in vLLM)
    mask_token_id: int = 0                # target token id in every mask slot (dflash_config.mask_token_id)
    block_size: int = 4                   # anchor + draft slots per trained block; serve with K <= block_size - 1


class DFlashAttention(nn.Module):
    """Names as vLLM loads them: q/k/v/o_proj and the per-head q_norm, k_norm."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = LlamaRMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(hd, cfg.rms_norm_eps)

    def key_value(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,H] -> roped keys, values [B,nkv,T,hd] (the context's, or the block's own)."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        return apply_rotary_pos_emb(k, k, cos, sin)[0], v

    def forward(self, x, cos, sin, context_kv, mask):
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.nh, self.hd)).transpose(1, 2)   # [B,nh,Q,hd]
        q = apply_rotary_pos_emb(q, q, cos, sin)[0]
        k, v = self.key_value(x, cos, sin)                                   # [B,nkv,Q,hd]
        keys, values = torch.cat([context_kv[0], k], 2), torch.cat([context_kv[1], v], 2)   # [B,nkv,C+Q,hd]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)  # mask [B|1,1,Q,C+Q]
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.nh * self.hd))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, x, cos, sin, context_kv, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        H = cfg.hidden_size
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.fc = nn.Linear(cfg.num_aux * H, H, bias=False)
        self.hidden_norm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(cfg.llama_config())
        # target_id = draft_id + d2t[draft_id]; t2d[target_id] is True for the draft vocab
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.embed_tokens.weight.requires_grad_(False)                       # the target's, frozen

    def context_kv(self, aux: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """aux [B,T,n_aux,H] -> per layer the context's keys and values [B,nkv,T,hd] at `position_ids`."""
        context = self.hidden_norm(self.fc(aux.flatten(-2)))                # [B,T,H]
        cos, sin = self.rotary_emb(context, position_ids)
        return [layer.self_attn.key_value(context, cos, sin) for layer in self.layers]

    def decode(self, input_ids, position_ids, context_kv, mask) -> torch.Tensor:
        """The block: tokens [B,Q] at `position_ids` over the context -> output [B,Q,H] before the final norm."""
        x = self.embed_tokens(input_ids).to(self.fc.weight.dtype)           # [B,Q,H]
        cos, sin = self.rotary_emb(x, position_ids)
        for layer, kv in zip(self.layers, context_kv):
            x = layer(x, cos, sin, kv, mask)
        return x

    def compute_logits(self, out: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """decode()'s output [B,Q,H] -> draft-vocab logits [B,Q,Vd] (or [R,Vd] at flat `rows`)."""
        normed = self.norm(out)
        return self.lm_head(normed if rows is None else normed.flatten(0, 1)[rows])

    def slot_logits(self, out: torch.Tensor, rows: torch.Tensor | None, prev_ids: torch.Tensor) -> torch.Tensor:
        """A block slot's draft-vocab logits given the token before it (`prev_ids`, target ids, one per
        row): DFlash's do not depend on it (DSpark adds its Markov bias here)."""
        return self.compute_logits(out, rows)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def init_from_target(self, target_model, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        init_heads_from_target(self, target_model, d2t, t2d)
