"""Shared test set-up: tests run on uvloop, like the proxy."""
