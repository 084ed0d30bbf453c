"""The Prometheus text (format 0.0.4) of a server's gauges, counters and histograms, as /metrics
answers it (docs/serve.md, Metrics)."""

from __future__ import annotations

from kern_pool import Finish
from kern_runtime.serving import BUCKETS, Histogram, Serving

__all__ = ["metrics_text"]


def _histogram(name: str, doc: str, h: Histogram) -> list[str]:
    out = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    total = 0
    for bound, n in zip(BUCKETS, h.counts, strict=False):
        total += n
        out.append(f'{name}_bucket{{le="{bound}"}} {total}')
    out += [f'{name}_bucket{{le="+Inf"}} {h.count}', f"{name}_sum {h.sum}", f"{name}_count {h.count}"]
    return out


_GAUGES = {
    "queue_depth": "Requests waiting for a row.",
    "running_rows": "Requests holding a row (in prefill or decode).",
    "open_sequences": "Engine sequences open.",
    "leased_pages": "KV pages the running requests' leases hold.",
    "pool_pages_used": "KV pages in use (leases and prefix index entries).",
    "pool_pages_total": "KV pages of the pool.",
    "prefix_resident": "Prefix index entries on the device.",
    "prefix_parked": "Prefix index entries parked on the host tier.",
    "host_units_used": "Host tier units in use.",
    "host_units_total": "Host tier units.",
    "tokens_per_second": "Output tokens per second over the last 5 s.",
}


def metrics_text(serving: Serving) -> str:
    """The Prometheus text exposition of the server's gauges, counters and histograms."""
    st, gauges = serving.report()
    out: list[str] = []
    for key, doc in _GAUGES.items():
        if key in gauges:
            out += [f"# HELP kern_{key} {doc}", f"# TYPE kern_{key} gauge", f"kern_{key} {gauges[key]}"]
    rate = st.hits / st.admissions if st.admissions else 0.0
    out += ["# HELP kern_prefix_hit_rate Admitted prompts that reused a cached prefix.",
            "# TYPE kern_prefix_hit_rate gauge", f"kern_prefix_hit_rate {rate}"]
    counters = {"generated_tokens": (st.generated, "Output tokens generated."),
                "prompt_tokens": (st.prompt, "Prompt tokens admitted."),
                "reused_tokens": (st.reused, "Prompt tokens reused from the prefix cache."),
                "refused_requests": (st.refused, "Requests refused with a full queue."),
                "parked_requests": (st.parks, "Running requests parked to make room."),
                "steps": (st.steps, "Engine steps executed."),
                "ahead_steps": (st.ahead, "Engine steps issued before the step in flight was read back."),
                "ridden_tokens": (st.ridden, "Prompt tokens computed as rows of the batched decode step.")}
    for key, (value, doc) in counters.items():
        out += [f"# HELP kern_{key}_total {doc}", f"# TYPE kern_{key}_total counter", f"kern_{key}_total {value}"]
    out += ["# HELP kern_requests_total Requests ended, by outcome.", "# TYPE kern_requests_total counter"]
    ends = {**{f.value: 0 for f in Finish}, **st.finished, "error": st.failed}
    out += [f'kern_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(ends.items())]
    out += _histogram("kern_ttft_seconds", "Time from submission to the first token.", st.ttft)
    out += _histogram("kern_tpot_seconds", "Time between a request's tokens.", st.tpot)
    return "\n".join(out) + "\n"
