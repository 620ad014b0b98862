"""The command line: the only package that imports typer and rich. One module per command."""
