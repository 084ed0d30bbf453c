"""kern_runtime."""

__all__: list[str] = []
