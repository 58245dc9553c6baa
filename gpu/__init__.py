"""SMA training on Dask workers (not yet built: see the open issue)."""

__all__: list[str] = []
