"""Shared test helpers for kern-mining (imported by tests, never by conftest)."""
