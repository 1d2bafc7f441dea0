"""Kept for existing imports: the helpers now live in tests.fixtures.sim_client."""

from tests.fixtures.sim_client import json_events, load, poll, sse_events

__all__ = ["json_events", "load", "poll", "sse_events"]
