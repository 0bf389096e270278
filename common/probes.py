"""The /healthz and /readyz glue both metrics endpoints share: a WSGI app that answers the probe paths from a
component's own health keeper (`with_probes`) and hands every other path to prometheus_client's app. What the
answers mean is decided once in detectors/health.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from detectors.health import ProbeAnswer, probe_response

WsgiApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


class Probed(Protocol):
    """A component's health keeper: its liveness and readiness now."""

    def live(self) -> ProbeAnswer: ...

    def ready(self) -> ProbeAnswer: ...


def with_probes(metrics_app: Any, health: Probed) -> WsgiApp:
    """A WSGI app: /healthz and /readyz from `health` (detectors.health.probe_response), every other path to
    `metrics_app` (prometheus_client's), as before."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        answer = probe_response(environ.get("PATH_INFO", ""), live=health.live, ready=health.ready)
        if answer is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        status, body = answer
        start_response(
            status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        )
        return [body]

    return app
