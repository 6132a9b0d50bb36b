"""The package version, in a module of its own so that lower layers (the compile cache's
keys) can read it without importing the package's public face."""

__version__ = "0.1.0"
