"""Wire types: everything that crosses HTTP, and nothing else. A leaf: it imports pydantic and
the standard library (and msgpack, for the compact form), never our other packages (tests/test_imports.py holds that line).

    wire.batches    batches and trajectories (RolloutRequest, Trajectory, states, failures)
    wire.engines    engine registration, roles and weight updates
    wire.envs       the env-worker wire (EnvOpen, EnvStepped, WorkerInfo)
    wire.sessions   the gateway's OpenAI-compatible session proxy
    wire.auth       API keys
    wire.packed     the compact trajectory form (msgpack, token arrays packed as int32/float32)
    wire.recording  a batch's recording (`rollout export` / `rollout replay`)
    wire.errors     the one error shape, and the exceptions that render as it
    wire.base       what the families share (model bases, bounds, Message)

Pydantic (and msgpack, for the compact form) lives here and only here. Inside the service the same data travels as these models
(they are the stored form in Redis too), so a trajectory read back by a trainer is
byte-for-byte what the worker recorded. Every name is importable from `wire` itself.

Example:
    >>> from wire import RolloutRequest
    >>> RolloutRequest(tasks=[{"question": "2+2?", "answer": 4}], env="math", group_size=2).num_trajectories
    2
"""

from wire.auth import ApiKeyCreate, ApiKeyCreated
from wire.base import (
    MAX_GROUP_SIZE,
    MAX_TOKENS_PER_TURN,
    MAX_TURNS,
    FunctionCall,
    Input,
    Int,
    Message,
    Seed,
    ToolCall,
    Version,
    Wire,
)
from wire.batches import (
    TERMINAL_STATES,
    USABLE_STATES,
    BatchCreated,
    BatchState,
    BatchStatus,
    BatchTotals,
    Failure,
    FailureKind,
    GroupStatus,
    RolloutRequest,
    Sample,
    SamplingParams,
    StateRules,
    Trajectory,
    TrajectoryEvent,
    TrajectoryPage,
    TrajectoryState,
    Turn,
    TurnTimings,
)
from wire.engines import (
    EngineInfo,
    EngineRoleUpdate,
    EngineStatus,
    EngineUpdateResult,
    LoadedWeights,
    WeightUpdate,
    WeightUpdateResult,
)
from wire.envs import EnvAction, EnvOpen, EnvOpened, EnvStepped, WorkerInfo
from wire.errors import ApiError, Conflict, ErrorBody, ErrorResponse, NotFound, Overloaded, error_body
from wire.packed import PackedTrajectory, PackedTurn, TrainingArrays
from wire.recording import RecordedStep, RecordedTrajectory, RecordingHeader
from wire.sessions import (
    ChatCompletionRequest,
    ChatMessageIn,
    ResponsesRequest,
    SessionCreate,
    SessionCreated,
    SessionFinish,
    ToolDef,
)

__all__ = [
    "MAX_GROUP_SIZE", "MAX_TOKENS_PER_TURN", "MAX_TURNS", "TERMINAL_STATES", "USABLE_STATES", "ApiError",
    "ApiKeyCreate", "ApiKeyCreated", "BatchCreated", "BatchState", "BatchStatus", "BatchTotals",
    "ChatCompletionRequest", "ChatMessageIn", "Conflict", "EngineInfo", "EngineRoleUpdate", "EngineStatus",
    "EngineUpdateResult", "EnvAction", "EnvOpen",
    "EnvOpened", "EnvStepped", "ErrorBody", "ErrorResponse", "Failure", "FailureKind", "FunctionCall", "GroupStatus",
    "Input", "Int", "LoadedWeights", "Message", "NotFound", "Overloaded", "PackedTrajectory", "PackedTurn", "TrainingArrays", "RecordedStep", "RecordedTrajectory", "RecordingHeader",
    "ResponsesRequest", "RolloutRequest", "Sample",
    "SamplingParams", "Seed", "SessionCreate", "SessionCreated", "SessionFinish", "StateRules", "ToolCall", "ToolDef",
    "Trajectory", "TrajectoryEvent", "TrajectoryPage", "TrajectoryState", "Turn", "TurnTimings", "Version",
    "WeightUpdate", "WeightUpdateResult", "Wire", "WorkerInfo", "error_body",
]
