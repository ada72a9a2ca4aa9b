"""Tests of fleetserve.batching."""
