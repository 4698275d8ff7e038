"""`specd run`: load the configuration, read the cluster token, serve the API."""

import functools
import logging
from pathlib import Path

import typer
import uvicorn

from daemon.cluster_token import TokenError, read_token
from daemon.specd.collect import collect_inventory
from daemon.specd.config import ConfigError, load_config
from daemon.specd.header_timeout import header_timeout_protocol

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="specd: the specctl node daemon."
)


@app.callback()
def _root() -> None:
    """specd: the specctl node daemon."""


@app.command("run", help="Serve the node API (inventory, Ray start/stop/status, logs).")
def run_command(
    # defaults in parentheses: "[/etc/...]" read as a closing Rich markup tag, and --help crashed
    host: str | None = typer.Option(None, "--host", help="Bind address (127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="API port (7601)."),
    token_file: str | None = typer.Option(
        None, "--token-file", help="Cluster token file (/etc/specd/cluster.token)."
    ),
    config_file: Path | None = typer.Option(None, "--config", help="specd.toml to read."),
) -> None:
    from daemon.specd.app import create_app
    from daemon.specd.log_tail import setup_logging
    from daemon.specd.ray_node import RayNode

    try:
        overrides = {"host": host, "port": port, "token_file": token_file}
        config = load_config(config_file, overrides)
        token_path = Path(config.token_file).expanduser()
        token = read_token(token_path)
        Path(config.state_dir).mkdir(parents=True, exist_ok=True)
        setup_logging(config.log_file)
    except (ConfigError, TokenError) as error:
        typer.echo(f"specd: {error}", err=True)
        raise typer.Exit(code=2) from None
    except OSError as error:
        typer.echo(f"specd: state_dir {config.state_dir}: {error.strerror}", err=True)
        raise typer.Exit(code=2) from None
    inventory = functools.partial(collect_inventory, config.node_name)
    logging.getLogger("daemon.specd").info("node %s: %s", config.node_name, inventory().summary())
    ray_node = RayNode(config, token_path, inventory, token)
    api = create_app(config, token, token_path, ray_node, inventory)
    uvicorn.run(
        api,
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,
        http=header_timeout_protocol(),  # idle or half-sent connections are closed
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
