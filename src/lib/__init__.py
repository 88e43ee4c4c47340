"""Code shared by the two functions and archive-ctl, one sub-package per responsibility."""
