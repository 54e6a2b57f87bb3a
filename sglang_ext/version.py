"""The package version and the one SGLang release it supports (imports nothing)."""

__version__ = "0.1.0"

SUPPORTED_SGLANG_VERSION = "0.5.23"
