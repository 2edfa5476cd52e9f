"""Start an env server: `python -m envs.serve` (what `flywheel env serve` runs, without the flywheel's deps).

    PYTHONPATH=$PWD .venv-osworld/bin/python -m envs.serve --env osworld --slots 2 --host 0.0.0.0 --port 8100 \\
        --provider docker --tasks-dir ~/OSWorld/evaluation_examples        # token from $FLYWHEEL_ENV_TOKEN

The OSWorld venv (scripts/setup_osworld.sh) has desktop-env and FastAPI but not the flywheel's training
stack, so this entry point imports only envs/, agents/ and the HTTP layer. Bad options: one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from envs.server_http import ServerSettings, serve
from envs.wire import TOKEN_ENV


def build_settings(
    *,
    env: str,
    slots: int,
    token: str | None,
    idle_timeout: float,
    health_interval: float,
    max_body_kb: int,
    call_timeout: float = 600.0,
    max_body_total_mb: int = 64,
    max_session: float = 3600.0,
    rate_limit: float | None = None,
    header_timeout: float = 5.0,
    max_connections: int = 1000,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    screenshot_scale: int,
    provider: str,
    path_to_vm: str | None,
    screen_size: str,
    a11y_tree: bool,
    tasks_dir: str | None,
) -> ServerSettings:
    """Server settings from command-line options; ValueError (one line) for a bad combination."""
    if max_body_total_mb * 1024 < max_body_kb:
        raise ValueError("--max-body-total-mb must hold at least one body of --max-body-kb")
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if env == "miniwob":
        kwargs: dict = {"screenshot_scale": screenshot_scale}
    elif env == "osworld":
        try:
            w, h = (int(v) for v in screen_size.lower().split("x"))
        except ValueError:
            raise ValueError(f"--screen-size must be WxH, e.g. 1920x1080 (got {screen_size!r})") from None
        kwargs = {
            "provider_name": provider,
            "path_to_vm": path_to_vm,
            "screen_size": (w, h),
            "require_a11y_tree": a11y_tree,
            "tasks_dir": os.path.expanduser(tasks_dir) if tasks_dir else None,
        }
    else:
        raise ValueError(f"unknown --env {env!r}; use miniwob or osworld")
    return ServerSettings(
        env=env,
        slots=slots,
        env_kwargs=kwargs,
        token=token or os.environ.get(TOKEN_ENV) or None,
        idle_timeout_s=idle_timeout,
        health_interval_s=health_interval,
        max_body_bytes=max_body_kb * 1024,
        max_body_total_bytes=max_body_total_mb << 20,
        call_timeout_s=call_timeout,
        max_session_s=max_session,
        rate_limit_per_s=rate_limit,
        header_timeout_s=header_timeout,
        max_connections=max_connections,
        tls_cert=os.path.expanduser(tls_cert) if tls_cert else None,
        tls_key=os.path.expanduser(tls_key) if tls_key else None,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m envs.serve", description="Serve GUI envs over HTTP.")
    p.add_argument("--env", default="miniwob", choices=["miniwob", "osworld"], help="env kind the slots host")
    p.add_argument("--slots", type=int, default=2, help="envs hosted (one episode each at a time)")
    p.add_argument("--port", type=int, default=8100, help="TCP port (0: any free port, printed)")
    p.add_argument("--host", default="127.0.0.1", help="bind address; non-loopback needs a token")
    p.add_argument("--token", default=None, help=f"API token (default: ${TOKEN_ENV})")
    p.add_argument(
        "--idle-timeout", type=float, default=300.0, help="seconds before an idle session's slot is reclaimed"
    )
    p.add_argument("--health-interval", type=float, default=15.0, help="seconds between health checks of an idle slot")
    p.add_argument("--max-body-kb", type=int, default=1024, help="request body limit (KiB)")
    p.add_argument(
        "--call-timeout", type=float, default=600.0, help="seconds before an env call counts as stuck (slot restarts)"
    )
    p.add_argument("--max-body-total-mb", type=int, default=64, help="request bodies held at once, all requests")
    p.add_argument("--max-session", type=float, default=3600.0, help="seconds a session may live (0: no limit)")
    p.add_argument("--rate-limit", type=float, default=None, help="requests/s per token (default 50 per slot; 0: off)")
    p.add_argument("--header-timeout", type=float, default=5.0, help="seconds to send a request's headers")
    p.add_argument("--max-connections", type=int, default=1000, help="open connections (past it: idle ones close)")
    p.add_argument("--tls-cert", default=None, help="PEM certificate (chain): serve https")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--screenshot-scale", type=int, default=1, help="miniwob: screenshot upscale")
    p.add_argument("--provider", default="docker", help="osworld: desktop-env provider")
    p.add_argument("--path-to-vm", default=None, help="osworld: VM image/path for the provider")
    p.add_argument("--screen-size", default="1920x1080", help="osworld: VM screen WxH")
    p.add_argument("--a11y-tree", action="store_true", help="osworld: accessibility tree into ui_text")
    p.add_argument("--tasks-dir", default=None, help="osworld: evaluation_examples folder (task JSON by id)")
    p.add_argument("--access-log", action="store_true", help="log every request (method, path, status)")
    a = p.parse_args(argv)
    try:
        settings = build_settings(
            env=a.env,
            slots=a.slots,
            token=a.token,
            idle_timeout=a.idle_timeout,
            health_interval=a.health_interval,
            max_body_kb=a.max_body_kb,
            call_timeout=a.call_timeout,
            max_body_total_mb=a.max_body_total_mb,
            max_session=a.max_session,
            rate_limit=a.rate_limit,
            header_timeout=a.header_timeout,
            max_connections=a.max_connections,
            tls_cert=a.tls_cert,
            tls_key=a.tls_key,
            screenshot_scale=a.screenshot_scale,
            provider=a.provider,
            path_to_vm=a.path_to_vm,
            screen_size=a.screen_size,
            a11y_tree=a.a11y_tree,
            tasks_dir=a.tasks_dir,
        )
        serve(settings, host=a.host, port=a.port, access_log=a.access_log)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
