"""`flywheel env ...`: serve envs over HTTP (a typer sub-app; the main CLI mounts it).

    FLYWHEEL_ENV_TOKEN=... flywheel env serve --env miniwob --slots 4 --port 8100
    python -m envs.serve --env osworld ...     # the same server from the OSWorld venv (scripts/setup_osworld.sh)

The token comes from $FLYWHEEL_ENV_TOKEN (or --token; the variable keeps it out of `ps` and shell
history). Bad input (non-loopback host without a token, bad screen size) prints one line, exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

env_app = typer.Typer(help="Serve GUI environments over HTTP (rollouts over many machines).", no_args_is_help=True)
err_console = Console(stderr=True, soft_wrap=True)


def _fail(msg: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {msg}", markup=True, highlight=False)
    return typer.Exit(2)


@env_app.command("serve")
def serve_cmd(
    env: str = typer.Option("miniwob", "--env", help="Env kind the slots host: miniwob | osworld."),
    slots: int = typer.Option(2, "--slots", min=1, max=256, help="Envs hosted (one episode each at a time)."),
    port: int = typer.Option(8100, "--port", min=0, max=65535, help="TCP port (0: any free port, printed)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address; non-loopback needs a token."),
    token: Optional[str] = typer.Option(
        None,
        "--token",
        show_default=False,
        help="API token (default: $FLYWHEEL_ENV_TOKEN; unset = no token, loopback only).",
    ),
    idle_timeout: float = typer.Option(
        300.0, "--idle-timeout", min=1.0, help="Seconds without a call before a session's slot is reclaimed."
    ),
    health_interval: float = typer.Option(
        15.0, "--health-interval", min=0.5, help="Seconds between health checks of an idle slot."
    ),
    max_body_kb: int = typer.Option(1024, "--max-body-kb", min=1, help="Request body limit (KiB)."),
    call_timeout: float = typer.Option(
        600.0, "--call-timeout", min=1.0, help="Seconds before an env call counts as stuck (the slot restarts)."
    ),
    max_body_total_mb: int = typer.Option(
        64, "--max-body-total-mb", min=1, help="Request bodies held at once across all requests (MiB; past it 503)."
    ),
    max_session: float = typer.Option(
        3600.0, "--max-session", min=0.0, help="Seconds a session may live before its slot is freed (0: no limit)."
    ),
    rate_limit: Optional[float] = typer.Option(
        None, "--rate-limit", min=0.0, show_default=False, help="Requests/s per token (default 50 per slot; 0: off)."
    ),
    header_timeout: float = typer.Option(
        5.0, "--header-timeout", min=0.1, help="Seconds a connection has to send a request's headers (and TLS hello)."
    ),
    max_connections: int = typer.Option(
        1000, "--max-connections", min=1, help="Open connections; past it the longest idle one is closed."
    ),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="PEM certificate (chain): serve https."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="PEM private key of --tls-cert."),
    screenshot_scale: int = typer.Option(1, "--screenshot-scale", min=1, max=4, help="miniwob: screenshot upscale."),
    provider: str = typer.Option(
        "docker", "--provider", help="osworld: desktop-env provider (docker, vmware, aws, ...)."
    ),
    path_to_vm: Optional[str] = typer.Option(None, "--path-to-vm", help="osworld: VM image/path for the provider."),
    screen_size: str = typer.Option("1920x1080", "--screen-size", help="osworld: VM screen size WxH."),
    a11y_tree: bool = typer.Option(
        False, "--a11y-tree/--no-a11y-tree", help="osworld: put the accessibility tree in ui_text."
    ),
    tasks_dir: Optional[Path] = typer.Option(
        None, "--tasks-dir", help="osworld: evaluation_examples folder to find task JSON by id."
    ),
    access_log: bool = typer.Option(False, "--access-log", help="Log every request (method, path, status)."),
):
    """Host SLOTS envs of one kind behind HTTP until interrupted (Ctrl-C / SIGTERM close them)."""
    from envs.serve import build_settings
    from envs.server_http import serve

    try:
        settings = build_settings(
            env=env,
            slots=slots,
            token=token,
            idle_timeout=idle_timeout,
            health_interval=health_interval,
            max_body_kb=max_body_kb,
            call_timeout=call_timeout,
            max_body_total_mb=max_body_total_mb,
            max_session=max_session,
            rate_limit=rate_limit,
            header_timeout=header_timeout,
            max_connections=max_connections,
            tls_cert=str(tls_cert) if tls_cert else None,
            tls_key=str(tls_key) if tls_key else None,
            screenshot_scale=screenshot_scale,
            provider=provider,
            path_to_vm=path_to_vm,
            screen_size=screen_size,
            a11y_tree=a11y_tree,
            tasks_dir=str(tasks_dir) if tasks_dir else None,
        )
        serve(settings, host=host, port=port, access_log=access_log)
    except ValueError as e:
        raise _fail(str(e)) from None
    except OSError as e:  # port in use, address not available
        raise _fail(f"cannot bind {host}:{port}: {e.strerror or e}") from None
