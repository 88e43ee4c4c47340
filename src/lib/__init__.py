"""Code shared by the two functions and archive-ctl, one sub-package per responsibility."""

# The release: `archive-ctl --version`, and pyproject.toml's version (read from here).
__version__ = "0.1.0"
