"""The object-store tests (a package, so that its conftest is not the module `conftest`)."""
