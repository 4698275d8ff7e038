"""Speculation across processes and nodes: the draft server, the verifier's remote proposer,
the wire format between them, and the transport that carries it."""
