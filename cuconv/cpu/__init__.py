"""cuconv's CPU path: the NumPy reference of every pass (``reference``)."""
