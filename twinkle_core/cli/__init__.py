"""The `twinkle` command line. See `twinkle_core.cli.main` for how subcommands are added."""
