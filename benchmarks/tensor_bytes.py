"""Counting tensor bytes for the VRAM benchmarks: live-storage peaks (a TorchDispatchMode) and the bytes of
persistent tensors (parameters, gradients, optimizer state, bitsandbytes quantisation states), one storage once."""

from __future__ import annotations


class LiveBytes:
    """Peak of live tensor bytes: every storage an aten op returns, until it is garbage."""

    def __init__(self):
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self
        self.live, self.cur, self.peak = {}, 0, 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker._sweep()
                import torch

                for t in tree_flatten(out)[0]:
                    # plain tensors only: a DTensor (fsdp) has no storage of its own; its local part is one
                    if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu":
                        st = t.untyped_storage()
                        key = st.data_ptr()
                        if key and key not in tracker.live:
                            tracker.live[key] = (StorageWeakRef(st), st.nbytes())
                            tracker.cur += st.nbytes()
                tracker.peak = max(tracker.peak, tracker.cur)
                return out

        self.mode = Mode()

    def _sweep(self):
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.cur -= self.live.pop(key)[1]


def sum_tags(saved: dict) -> dict:
    out: dict[str, int] = {}
    for where, n in saved.values():
        out[where] = out.get(where, 0) + n
    return out


def with_quant_states(params) -> list:
    """The parameters and, for each bitsandbytes 4-bit one, the quantisation state it carries, which is no
    parameter or buffer: the absmax scales and NF4 code table, and with double quantisation the fp32 offset
    and the scales' own absmax and code table."""
    out = []
    for p in params:
        out.append(p)
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            out += [qs.absmax, qs.code] + ([qs.offset, qs.state2.absmax, qs.state2.code] if qs.nested else [])
    return out


def unique_storages(tensors) -> list:
    """One tensor per storage."""
    seen, out = set(), []
    for t in tensors:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            out.append(t)
    return out


def persistent_tensors(params, optimizer, grads: bool = False):
    tensors = list(params)
    if grads:
        tensors += [p.grad for p in params if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "untyped_storage") and v.dim() > 0]
    return unique_storages(tensors)
