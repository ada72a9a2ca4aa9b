"""The replica: KServe v2 HTTP/gRPC front ends, /inference, lifecycle."""
