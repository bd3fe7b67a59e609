from sdjax_runner.cli import entry

entry()
