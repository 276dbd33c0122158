"""eagle-parity: graph-versus-eager parity harness for EAGLE speculative decoding."""

__version__ = "0.1.0"
