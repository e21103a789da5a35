__version__ = "0.1.0"


def installed_version(dist: str) -> str | None:
    """Version of an installed distribution (e.g. "cuda-bindings"), None if absent. Reads
    package metadata only: no library is loaded."""
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # not installed, or no metadata
        return None
