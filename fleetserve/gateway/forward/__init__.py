"""Forward: carry a request to the replica the balancer picked, retry or hedge it, and answer.

:mod:`.core` is the forwarding logic, written once; :mod:`.http` and :mod:`.grpc` adapt it to each protocol
(with :mod:`.headers` for what an HTTP request carries on, :mod:`.channels` for the gRPC channels);
:mod:`.upstream` and :mod:`.http1` are the keep-alive HTTP/1.1 pool to replicas; :mod:`.hedge` decides when
to send a second copy and races the two.
"""
