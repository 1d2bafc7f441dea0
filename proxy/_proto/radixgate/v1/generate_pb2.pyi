from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("model", "text", "input_ids", "chat", "sampling", "session_key", "priority", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    input_ids: TokenIds
    chat: ChatMessages
    sampling: SamplingParams
    session_key: str
    priority: int
    request_id: str
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., input_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., session_key: _Optional[str] = ..., priority: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "seed", "extra_json")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EXTRA_JSON_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    seed: int
    extra_json: str
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., seed: _Optional[int] = ..., extra_json: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_count", "final")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_count: int
    final: Final
    def __init__(self, text: _Optional[str] = ..., token_count: _Optional[int] = ..., final: _Optional[_Union[Final, _Mapping]] = ...) -> None: ...

class GenerateUnaryResponse(_message.Message):
    __slots__ = ("text", "final")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    final: Final
    def __init__(self, text: _Optional[str] = ..., final: _Optional[_Union[Final, _Mapping]] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens", "worker", "request_id", "timings")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    worker: str
    request_id: str
    timings: StageTimings
    def __init__(self, finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., worker: _Optional[str] = ..., request_id: _Optional[str] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("admission_wait_s", "proxy_overhead_s", "upstream_ttfb_s", "worker_queue_s", "ttft_s", "itl_mean_s", "itl_p95_s", "itl_max_s", "decode_s", "e2e_s", "prefix_hold_s")
    ADMISSION_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    PROXY_OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_TTFB_S_FIELD_NUMBER: _ClassVar[int]
    WORKER_QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    ITL_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    ITL_P95_S_FIELD_NUMBER: _ClassVar[int]
    ITL_MAX_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HOLD_S_FIELD_NUMBER: _ClassVar[int]
    admission_wait_s: float
    proxy_overhead_s: float
    upstream_ttfb_s: float
    worker_queue_s: float
    ttft_s: float
    itl_mean_s: float
    itl_p95_s: float
    itl_max_s: float
    decode_s: float
    e2e_s: float
    prefix_hold_s: float
    def __init__(self, admission_wait_s: _Optional[float] = ..., proxy_overhead_s: _Optional[float] = ..., upstream_ttfb_s: _Optional[float] = ..., worker_queue_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., itl_mean_s: _Optional[float] = ..., itl_p95_s: _Optional[float] = ..., itl_max_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., prefix_hold_s: _Optional[float] = ...) -> None: ...
