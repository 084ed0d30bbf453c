"""kern_manifest."""

__all__: list[str] = []
