"""`python -m linpipe.cli`: the `linpipe` command."""
from linpipe.cli import main

main()
