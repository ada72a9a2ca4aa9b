"""Model zoo: named models, their ONNX export, tokenizers and the on-disk model store."""
