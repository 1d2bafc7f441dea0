"""radixgate: a prefix-affinity, admission-aware sidecar proxy for SGLang workers."""

__version__ = "0.1.0"
