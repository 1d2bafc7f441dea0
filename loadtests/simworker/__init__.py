"""A simulated SGLang worker with a roofline performance model (see README.md)."""

from .config import SimConfig
from .fleet import Fleet

__all__ = ["Fleet", "SimConfig"]
