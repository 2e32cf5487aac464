"""python -m bfcshim ARGS: the bfcshim command shipped in this package."""
from . import _main

_main()
