"""Forward: carry a request to the replica the balancer picked, retry or hedge it, and answer."""
