"""StreamPETR's transformer decoder: post-norm layers of self-attention over the queries and the temporal memory,
cross-attention to the image tokens, and a feed-forward block; every layer's output through one final LayerNorm.

Per layer (``Q`` queries, ``M`` memory entries that are not propagated queries, ``T`` image tokens):

- self-attention: query ``q + q_pos``; keys ``[q; memory] + [q_pos; memory_pos]``; values ``[q; memory]``
  (no position); the denoising mask decides which keys each query sees; residual, dropout, LayerNorm;
- cross-attention: query ``q + q_pos``; keys ``tokens + token_pos``; values ``tokens``; residual, dropout,
  LayerNorm;
- FFN: ``Linear(E, F)``, ReLU, dropout, ``Linear(F, E)``, dropout; residual; LayerNorm.

Mirrors ``PETRTemporalTransformer``, ``PETRTransformerDecoder`` (``return_intermediate``, ``post_norm``) and
``PETRTemporalDecoderLayer._forward`` of StreamPETR (``projects/mmdet3d_plugin/models/utils/petr_transformer.py``)
with the published ``operation_order`` ``(self_attn, norm, cross_attn, norm, ffn, norm)``; the self-attention is
``PETRMultiheadAttention`` (``nn.MultiheadAttention``), the cross-attention ``PETRMultiheadFlashAttention``, both
``dropout=0.1`` (attention weights and the residual branch), and mmcv's ``FFN`` with ``ffn_drop=0.1``.
Both attentions run through ``torch.nn.functional.scaled_dot_product_attention`` (flash/memory-efficient
kernels where the device has them) with the arithmetic of ``nn.MultiheadAttention``: packed ``in_proj``
(``3E × E``), ``out_proj``, scaling ``1/√(E/H)``. Deviations: batch-first tensors throughout (the original
transposes to sequence-first and back); the mask is passed as "may attend" (``True`` = visible), the inverse
of the original's convention; the flash attention's fp16 cast is left to autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["Attention", "Decoder", "DecoderLayer"]


class Attention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters and arithmetic, computed by SDPA.

    Args:
        embed_dims: ``E``.
        num_heads: ``H`` (``E`` must be a multiple).
        dropout: dropout of the attention weights (training only).
    """

    def __init__(self, embed_dims: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f"embed_dims: {embed_dims} is not a multiple of num_heads={num_heads}")
        self.num_heads, self.dropout = num_heads, dropout
        self.in_proj = nn.Linear(embed_dims, 3 * embed_dims)
        self.out_proj = nn.Linear(embed_dims, embed_dims)
        nn.init.xavier_uniform_(self.in_proj.weight)  # as nn.MultiheadAttention._reset_parameters
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention of every query over the keys.

        Args:
            query: ``(B, Q, E)``.
            key: ``(B, K, E)``.
            value: ``(B, K, E)``.
            visible: bool ``(Q, K)``: ``True`` where the query may attend to the key; None: all.

        Returns:
            ``(B, Q, E)``.
        """
        b, q, e = query.shape
        h = self.num_heads
        w_q, w_k, w_v = self.in_proj.weight.chunk(3)  # (E, E) each
        b_q, b_k, b_v = self.in_proj.bias.chunk(3)  # (E,) each

        def heads(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return F.linear(x, w, bias).view(b, x.shape[1], h, e // h).transpose(1, 2)  # (B, H, ·, E/H)

        out = F.scaled_dot_product_attention(
            heads(query, w_q, b_q),
            heads(key, w_k, b_k),
            heads(value, w_v, b_v),
            attn_mask=visible,
            dropout_p=self.dropout if self.training else 0.0,
        )  # (B, H, Q, E/H)
        return self.out_proj(out.transpose(1, 2).reshape(b, q, e))  # (B, Q, E)


class DecoderLayer(nn.Module):
    """One post-norm decoder layer (see the module docstring).

    Args:
        embed_dims: ``E`` (256).
        num_heads: ``H`` (8).
        ffn_dims: hidden size of the FFN (2048).
        dropout: attention, residual and FFN dropout (0.1).
    """

    def __init__(self, embed_dims: int = 256, num_heads: int = 8, ffn_dims: int = 2048, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = Attention(embed_dims, num_heads, dropout)
        self.cross_attn = Attention(embed_dims, num_heads, dropout)
        self.ffn = nn.Sequential(
            nn.Linear(embed_dims, ffn_dims),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(ffn_dims, embed_dims),
            nn.Dropout(dropout),
        )
        self.norms = nn.ModuleList(nn.LayerNorm(embed_dims) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        query: torch.Tensor,
        query_pos: torch.Tensor,
        tokens: torch.Tensor,
        token_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        visible: torch.Tensor | None,
    ) -> torch.Tensor:
        """One layer.

        Args:
            query: ``(B, Q, E)`` decoder state.
            query_pos: ``(B, Q, E)`` query position embeddings.
            tokens: ``(B, T, E)`` image tokens.
            token_pos: ``(B, T, E)`` their 3D position embeddings.
            memory: ``(B, M, E)`` temporal memory entries (extra self-attention keys and values).
            memory_pos: ``(B, M, E)`` their position embeddings.
            visible: bool ``(Q, Q + M)`` self-attention mask (``True`` = may attend), or None.

        Returns:
            ``(B, Q, E)``.
        """
        keys = torch.cat([query, memory], dim=1)  # (B, Q+M, E)
        keys_pos = torch.cat([query_pos, memory_pos], dim=1)  # (B, Q+M, E)
        attended = self.self_attn(query + query_pos, keys + keys_pos, keys, visible)  # (B, Q, E)
        query = self.norms[0](query + self.drop(attended))  # (B, Q, E)
        attended = self.cross_attn(query + query_pos, tokens + token_pos, tokens)  # (B, Q, E)
        query = self.norms[1](query + self.drop(attended))  # (B, Q, E)
        return self.norms[2](query + self.ffn(query))  # (B, Q, E)


class Decoder(nn.Module):
    """``L`` decoder layers; returns every layer's output through the shared final LayerNorm.

    Args:
        num_layers: ``L`` (6).
        embed_dims: ``E`` (256).
        num_heads: ``H`` (8).
        ffn_dims: FFN hidden size (2048).
        dropout: dropout everywhere in the layers (0.1).
        with_cp: recompute each layer in the backward pass (activation checkpointing; the published
            config's ``with_cp=True``), training only.
    """

    def __init__(
        self,
        num_layers: int = 6,
        embed_dims: int = 256,
        num_heads: int = 8,
        ffn_dims: int = 2048,
        dropout: float = 0.1,
        with_cp: bool = False,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(embed_dims, num_heads, ffn_dims, dropout) for _ in range(num_layers))
        self.post_norm = nn.LayerNorm(embed_dims)
        self.with_cp = with_cp
        for module in self.layers.modules():  # the original's init_weights: xavier_uniform, zero bias
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(
        self,
        query: torch.Tensor,
        query_pos: torch.Tensor,
        tokens: torch.Tensor,
        token_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """All layers (arguments as :meth:`DecoderLayer.forward`).

        Returns:
            ``(L, B, Q, E)``: each layer's output after the final LayerNorm.
        """
        outputs = []
        for layer in self.layers:
            args = (query, query_pos, tokens, token_pos, memory, memory_pos, visible)
            if self.with_cp and self.training and torch.is_grad_enabled():
                query = checkpoint(layer, *args, use_reentrant=False)  # (B, Q, E)
            else:
                query = layer(*args)  # (B, Q, E)
            outputs.append(self.post_norm(query))
        return torch.stack(outputs)  # (L, B, Q, E)
