"""Type stubs for the Rust extension ``cpkv._cpkv``."""

__version__: str
