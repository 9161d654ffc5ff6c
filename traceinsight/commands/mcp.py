"""``traceinsight mcp``: the analyses as MCP tools over stdio (traceinsight/mcp_server.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from traceinsight.errors import EXIT_OK, InputError

INSTALL_HINT = "the MCP server needs the mcp extra: pip install 'traceinsight-analyzer[mcp]'"


def run(allow: Sequence[Path], source_dirs: Sequence[Path] = ()) -> int:
    """Serve until the client closes stdin; stdout carries only the protocol."""
    try:
        import mcp.server.mcpserver  # noqa: F401  (the SDK's v2 API: mcp>=2)
    except ImportError:
        raise InputError(INSTALL_HINT) from None
    from traceinsight.mcp_server import Workspace, serve

    serve(Workspace.of(allow, source_dirs))
    return EXIT_OK
