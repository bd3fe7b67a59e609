from sdjax_runner.cli import main

main()
