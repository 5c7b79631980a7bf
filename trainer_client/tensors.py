"""Training samples as numpy arrays or torch tensors, from either trajectory form.

A `PackedTrajectory` (what the client fetches in the compact form) holds each sample's arrays
as raw int32/uint8/float32 bytes: `np.frombuffer` views them without touching a token, and
torch takes one copy. A `Trajectory` (the JSON form) holds Python lists and is converted.

    for s in traj.samples():
        ids, mask, logprobs = as_numpy(s)          # int32, uint8, float32; read-only views
        ids, mask, logprobs = as_torch(s)          # torch.int32, torch.uint8, torch.float32

Non-goals: padding and batching (`trainer_client.grpo.pack` does that).
"""

from __future__ import annotations

from typing import Any

from wire import Sample
from wire.packed import TrainingArrays


def as_numpy(s: Sample | TrainingArrays) -> tuple[Any, Any, Any]:
    import numpy as np

    if isinstance(s, TrainingArrays):
        return (np.frombuffer(s.token_ids, "<i4"), np.frombuffer(s.loss_mask, np.uint8),
                np.frombuffer(s.logprobs, "<f4"))
    return (np.asarray(s.token_ids, np.int32), np.asarray(s.loss_mask, np.uint8),
            np.asarray(s.logprobs, np.float32))


def as_torch(s: Sample | TrainingArrays) -> tuple[Any, Any, Any]:
    import torch

    if isinstance(s, TrainingArrays):
        # frombuffer wants a writable buffer (it shares memory); a bytearray is one copy, owned here
        return tuple(torch.frombuffer(bytearray(b), dtype=d) if b else torch.empty(0, dtype=d) for b, d in (
            (s.token_ids, torch.int32), (s.loss_mask, torch.uint8), (s.logprobs, torch.float32)))
    return (torch.as_tensor(s.token_ids, dtype=torch.int32), torch.as_tensor(s.loss_mask, dtype=torch.uint8),
            torch.as_tensor(s.logprobs, dtype=torch.float32))


__all__ = ["as_numpy", "as_torch"]
