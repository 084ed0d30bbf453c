"""CPU benchmarks. Each `bench_<name>.py` defines `run() -> list[dict]`: one row per measurement,
each row with at least `name`, `value`, `unit`, and where it applies `target` and `peer`."""
