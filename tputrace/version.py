"""The version of tputrace, in a module of its own so that the store and the recording can name it
without importing the package's entry points."""

__version__ = "0.1.0"
