"""The KV connector that hands vLLM's captured hidden states to specdraft on any device.

vLLM's `extract_hidden_states` speculative method writes, for every token of a request, the
residual stream entering each id in `eagle_aux_hidden_state_layer_ids` into a cache-only
attention layer; a KV connector copies them out when the request finishes. vLLM's stock
`ExampleHiddenStatesConnector` does that copy with CUDA streams, events and pinned memory, so it
fails on a CPU build. This subclass does the same copy synchronously: extract the request's
slots, save `hidden_states` [T, layers, H] and `token_ids` [T] to the file vLLM names in the
request's `kv_transfer_params["hidden_states_path"]`, then release the file's lock.

vLLM imports this module inside its engine process (`kv_connector_module_path`), so it imports
vLLM and nothing of specdraft.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Copied:
    """Stands in for the CUDA event the stock connector polls: a synchronous copy is done."""

    @staticmethod
    def query() -> bool:
        return True


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with a synchronous device -> file copy (CPU and CUDA)."""

    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)                 # [blocks]
        offsets = torch.arange(self._block_size, dtype=torch.long)                    # [block_size]
        slots = (block_ids[:, None] * self._block_size + offsets[None, :]).flatten()  # [blocks * block_size]
        num_tokens = pending.token_ids.shape[0]
        hidden = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), num_tokens)
        tensors = {"hidden_states": hidden.to("cpu").contiguous(),                    # [T, layers, H]
                   "token_ids": pending.token_ids.clone()}                            # [T]
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)   # releases the writer's LOCK_EX: readers may load the file now
        self._req_copy_events[pending.req_id] = _Copied()
