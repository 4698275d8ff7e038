"""The `specctl` command line. Each command lives in its own module under specctl/commands/
and is imported only when run, so `specctl --help` stays fast and the headless core never
imports textual."""

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="specctl: speculative decoding across unequal GPU machines.",
)


@app.command("init", help="Create the cluster token (0600) and print how to install it on each node.")
def init_command(
    token_file: str = typer.Option(
        "~/.config/specctl/cluster.token", "--token-file", help="Where to write the token."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing token."),
) -> None:
    from specctl.commands.init import run_init

    run_init(token_file=token_file, force=force)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
