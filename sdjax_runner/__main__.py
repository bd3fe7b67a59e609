from sdjax_runner.commands import entry

entry()
