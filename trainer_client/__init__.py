"""The trainer's side: a sync and an async client for the rollout-service gateway."""

from trainer_client._client import AsyncRolloutClient, RolloutClient
from trainer_client._errors import APIError, NotFoundError, RolloutError, TransportError, WeightUpdateError
from wire import BatchCreated, BatchStatus, Trajectory, TrajectoryEvent

__all__ = ["APIError", "AsyncRolloutClient", "BatchCreated", "BatchStatus", "NotFoundError", "RolloutClient",
           "RolloutError", "Trajectory", "TrajectoryEvent", "TransportError", "WeightUpdateError"]
