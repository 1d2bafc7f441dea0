"""Kept for existing imports: the helpers now live in loadtests.simworker.testing."""

from loadtests.simworker.testing import json_events, load, poll, sse_events

__all__ = ["json_events", "load", "poll", "sse_events"]
