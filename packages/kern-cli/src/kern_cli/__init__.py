"""kern_cli."""

__all__: list[str] = []
