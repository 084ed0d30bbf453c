"""kern_pool."""

__all__: list[str] = []
