"""Engines: ONNX (or a PyTorch definition) -> optimized, serialized, cached engine -> N runnable instances."""
