from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ...) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("url", "healthy", "stale", "in_flight", "running", "queued", "token_usage", "cache_hit_rate", "max_running_requests", "max_total_tokens", "page_size", "generation", "models")
    URL_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    url: str
    healthy: bool
    stale: bool
    in_flight: int
    running: int
    queued: int
    token_usage: float
    cache_hit_rate: float
    max_running_requests: int
    max_total_tokens: int
    page_size: int
    generation: int
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, url: _Optional[str] = ..., healthy: _Optional[bool] = ..., stale: _Optional[bool] = ..., in_flight: _Optional[int] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ..., token_usage: _Optional[float] = ..., cache_hit_rate: _Optional[float] = ..., max_running_requests: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., page_size: _Optional[int] = ..., generation: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class GetDiagnosisRequest(_message.Message):
    __slots__ = ("window_s",)
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    window_s: float
    def __init__(self, window_s: _Optional[float] = ...) -> None: ...

class GetDiagnosisResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
