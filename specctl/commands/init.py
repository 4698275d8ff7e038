"""`specctl init`: create the cluster token and say how to install it on each node."""

from pathlib import Path

import typer

from daemon.cluster_token import TokenError, generate_token, write_token

NODE_TOKEN_PATH = "/etc/specd/cluster.token"


def run_init(token_file: str, force: bool) -> None:
    if not token_file.strip():
        typer.echo("specctl: error: --token-file is empty; give the token file's path", err=True)
        raise typer.Exit(code=2)
    path = Path(token_file).expanduser()
    try:
        write_token(path, generate_token(), force=force)
    except TokenError as error:  # what is wrong with the path given: a usage error
        typer.echo(f"specctl: error: {error}", err=True)
        raise typer.Exit(code=2) from None
    except OSError as error:
        typer.echo(f"specctl: error: {path}: cannot write the token ({error.strerror})", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(_instructions(path))


def _instructions(path: Path) -> str:
    return f"""Cluster token written to {path} (mode 0600). Keep it secret: it admits a client to
every specd API and to the Ray cluster.

Install it on each node (as root there), then restart specd:

  scp {path} NODE:/tmp/cluster.token
  ssh NODE 'sudo install -D -m 0600 -o specd -g specd /tmp/cluster.token {NODE_TOKEN_PATH} \\
            && rm /tmp/cluster.token && sudo systemctl restart specd'

Clients (specctl, the TUI) read it from {path}; see docs/deploy-node.md."""
