"""kern_mining."""

__all__: list[str] = []
