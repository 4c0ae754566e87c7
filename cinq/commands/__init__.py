"""One module per `cinq` subcommand (see cinq/cli.py)."""
