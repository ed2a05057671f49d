"""linpipe's version, written only here (pyproject.toml reads it: `dynamic = ["version"]`): a
leaf module, so that any module may import it without importing linpipe's package (whose public
functions import the rest)."""
__version__ = "0.1.0"
