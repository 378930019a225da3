"""Self-contained demo: a small target/draft model pair trained on synthetic financial news.

The pair ships inside the package (``pair/``), so the demo runs offline. ``corpus`` generates the training
text, ``train_pair`` reproduces the weights, and ``assets.load_pair`` loads them.
"""
