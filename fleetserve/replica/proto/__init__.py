"""Generated protobuf and gRPC modules for the KServe v2 gRPC API (see grpc_service.proto, generate.py)."""
