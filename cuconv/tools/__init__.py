"""The tools behind ``python -m cuconv``: ``bench`` (single layers against cuDNN, and ``--models``: whole
torchvision models, ``bench_models``), ``warmup`` (``bench_models``) and ``info``."""
