"""The package version (a leaf module, so any layer can name it)."""

__version__ = "0.3.0"
