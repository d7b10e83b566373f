"""``mmpipe metrics``: mmpipe's series from a Ray metrics endpoint, as plain lines.

A local Ray of ``mmpipe run`` (and the head of ``mmpipe run --dashboard``) serves its
metrics agent's Prometheus text on a free port, printed at start (``metrics:
http://127.0.0.1:PORT/metrics``) and kept in its record (``local_ray.record``), where
``default_url`` finds the newest running one. ``scrape`` keeps the ``ray_mmpipe_*``
series (``metrics.py`` lists them) and sums each over Ray's own labels (``WorkerId``,
``NodeAddress``, ``SessionName``, ...: capitalised, where mmpipe's tag keys are lower
case; and OpenTelemetry's ``otel_scope_*``); histograms give their ``_count`` and
``_sum``. A gauge of an actor that has exited (``ray_mmpipe_worker_records``) is gone
from the endpoint. Nothing to download: the text is
parsed with ``prometheus_client`` (a dependency of ``ray[default]``).
"""

from __future__ import annotations

import collections
import urllib.error
import urllib.request

from pipeline.errors import MmpipeError
from pipeline.runtime import local_ray

PREFIX = "ray_mmpipe_"


class MetricsError(MmpipeError):
    """No metrics endpoint was found, or it did not answer."""


def default_url() -> str:
    """The metrics URL of the newest running local Ray of ``mmpipe run``; ``MetricsError``
    if none runs."""
    for rec in local_ray.live_records():
        if rec.get("metrics_url"):
            return rec["metrics_url"]
    raise MetricsError("no running local Ray of `mmpipe run` found: pass the URL printed "
                       "as `metrics:` at its start (a cluster: a node's :8080/metrics)")


def scrape(url: str, timeout_s: float = 5.0) -> dict[tuple[str, tuple], float]:
    """mmpipe's samples at ``url``: ``{(name, ((label, value), ...)): value}``, summed
    over Ray's labels, bucket samples left out. Raises ``MetricsError`` naming ``url``."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as e:
        raise MetricsError(f"metrics endpoint {url}: {e}") from e
    out: dict[tuple[str, tuple], float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k.islower() and not k.startswith("otel_")))
            out[(s.name, labels)] += s.value
    return dict(out)


def format_samples(samples: dict[tuple[str, tuple], float]) -> str:
    """One line per sample, sorted: ``name{label="value",...} value``."""
    lines = []
    for (name, labels), value in sorted(samples.items()):
        tags = ",".join(f'{k}="{v}"' for k, v in labels)
        lines.append(f"{name}{{{tags}}} {value:g}")
    return "\n".join(lines) + ("\n" if lines else "")
