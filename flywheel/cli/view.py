"""`flywheel view`: the trajectory viewer and the iteration report, as static HTML or on localhost.

flywheel view                                   # -> <lake>/_reports/view/index.html
flywheel view --compare stage=bootstrap --compare sft-it0   # + a side-by-side page (pairs of --compare)
flywheel view --serve --port 8765               # every episode, rendered on request
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from flywheel.cli.common import CONFIG_OPT, LAKE_OPT, err_console, lake_root
from flywheel.errors import UserError


def view_cmd(
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder for the static site (default: <lake>/_reports/view)."
    ),
    compare: List[str] = typer.Option(
        [],
        "--compare",
        help="A comparison side, given twice per comparison: "
        "key=value terms (policy_version, policy, stage, iteration, task_id; "
        "`checkpoint` = policy_version) joined by commas, or a unique "
        "policy-version substring.",
    ),
    max_pages: int = typer.Option(
        500,
        "--max-pages",
        help="Episode pages written by a static build (newest first; the index lists every episode).",
    ),
    serve: bool = typer.Option(False, "--serve", help="Serve the viewer on localhost instead of writing files."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address for --serve (loopback unless told otherwise)."),
    port: int = typer.Option(8765, "--port", help="Port for --serve."),
):
    """Browse episodes (screenshots with the actions drawn on them), compare policies side by side, and read
    the iteration report."""
    from storage.lake import open_lake
    from storage.objstore import is_object_uri
    from viewer.site import build_site
    from viewer.site import serve as serve_site

    if is_object_uri(lake_root(lake, config)):
        raise UserError(
            "the viewer reads a lake on disk: for an s3:// lake, query it with `flywheel query`, "
            "or view a local copy (`aws s3 sync` of the prefix)"
        )
    root = open_lake(lake_root(lake, config), create=False).root
    if len(compare) % 2:
        raise UserError("--compare comes in pairs: --compare A --compare B")
    if serve:
        err_console.print(f"serving {root} on http://{host}:{port}/ (Ctrl-C stops)")
        serve_site(root, host=host, port=port)
        return
    target = out or root / "_reports" / "view"
    res = build_site(
        root,
        target,
        compares=list(zip(compare[::2], compare[1::2])),
        max_pages=max_pages,
        log=lambda s: err_console.print(s, highlight=False),
        progress=err_console.is_terminal,
    )
    if res["episodes"] == 0:
        err_console.print(f"the lake at {root} has no episodes yet: the pages say so")
    err_console.print(
        f"{res['episodes']} episodes indexed, {res['pages']} episode pages, "
        f"{res['skipped_files']} unreadable files skipped, in {res['total_s']:.1f} s"
    )
    print((Path(target) / "index.html").resolve())
