"""reaper: durable liveness and garbage collection for cluster orchestrators."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reaper")
    """The installed release (``pyproject.toml``; CHANGELOG.md says what each one changed)."""
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
