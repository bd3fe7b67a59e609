import sys

from sdjax_runner.commands import missing_dependency

missing = missing_dependency()
if missing:
    print(missing, file=sys.stderr)
    sys.exit(1)

from sdjax_runner.commands import entry  # noqa: E402 -- after the check, which needs none of the libraries

entry()
