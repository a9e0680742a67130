"""The `tputrace` command line: one module per subcommand, listed in `tputrace.cli.main.COMMANDS`."""
