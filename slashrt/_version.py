"""slashrt's version: `slashrt.__version__`, and what checkpoint manifests record as their writer."""

__version__ = "0.1.0"
