"""pgpong: policy-gradient Pong from pixels, played in parallel on Ray."""

__version__ = "0.1.0"
