"""fleetserve: serve BERT-class transformer encoders fast on one GPU and evenly across many."""

__version__ = "0.1.0"
