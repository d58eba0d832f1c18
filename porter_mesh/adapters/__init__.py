"""Thin I/O drivers around the pure core: ZeroMQ sockets, zeroconf, disk, RDF store."""
