"""Integrations for libraries that build their own groups (see fr_backend.wrap)."""
