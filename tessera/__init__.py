"""The ``tessera`` command line: one subcommand per service and tool."""
